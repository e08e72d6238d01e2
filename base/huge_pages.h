// Transparent huge pages for big host buffers. Where the kernel's THP mode is "madvise" (Debian's
// default), a buffer of hundreds of MiB otherwise takes one page fault per 4 KiB on first touch —
// slow on virtual machines (on the CI VM, ~300 MB/s) — and with MADV_HUGEPAGE one per 2 MiB.
#pragma once
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace tf {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Asks for huge pages on the 2 MiB-aligned part of [p, p + bytes). Call before first touch; a hint
// only (ignored where THP is off).
inline void AdviseHugePages(void* p, size_t bytes) {
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(kHugePageBytes - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

// `bytes` of 2 MiB-aligned memory with huge pages advised (nullptr when out of memory); FreeLarge.
inline void* AllocateLarge(size_t bytes) {
  const size_t n = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, n == 0 ? kHugePageBytes : n);
  if (p != nullptr) AdviseHugePages(p, n);
  return p;
}
inline void FreeLarge(void* p) { std::free(p); }

}  // namespace tf
