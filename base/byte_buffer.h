// ByteBuffer: a growable byte buffer for big, reused payloads (encoded checkpoint chunks). Unlike
// std::string it starts 2 MiB-aligned with transparent huge pages advised (base/huge_pages.h), so
// it suits direct I/O (Env::NewDirectWritableFile) and is faulted in once per 2 MiB, and clear()
// keeps the memory for the next payload. Not copyable; movable.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <new>
#include <string_view>
#include <utility>

#include "base/huge_pages.h"

namespace tf {

class ByteBuffer {
 public:
  ByteBuffer() = default;
  ByteBuffer(const ByteBuffer&) = delete;
  ByteBuffer& operator=(const ByteBuffer&) = delete;
  ByteBuffer(ByteBuffer&& o) noexcept { *this = std::move(o); }
  ByteBuffer& operator=(ByteBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
    return *this;
  }
  ~ByteBuffer() { FreeLarge(data_); }

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  std::string_view view() const { return {data_, size_}; }
  operator std::string_view() const { return view(); }  // NOLINT: a buffer is its bytes

  void clear() { size_ = 0; }
  // Throws std::bad_alloc when out of memory, as std::string does.
  void reserve(size_t n) {
    if (n <= capacity_) return;
    const size_t grown = std::max(n, capacity_ + capacity_ / 2);
    auto* p = static_cast<char*>(AllocateLarge(grown));
    if (p == nullptr) throw std::bad_alloc();
    if (size_ > 0) std::memcpy(p, data_, size_);
    FreeLarge(data_);
    data_ = p;
    capacity_ = (grown + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  }
  void append(const char* p, size_t n) {
    reserve(size_ + n);
    if (n > 0) std::memcpy(data_ + size_, p, n);
    size_ += n;
  }
  void append(size_t n, char c) {
    reserve(size_ + n);
    std::memset(data_ + size_, c, n);
    size_ += n;
  }
  void push_back(char c) { append(1, c); }

 private:
  char* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
};

}  // namespace tf
