// cuemu runtime: the fiber scheduler behind cuemu::Launch, the warp collectives and tensor-core
// instructions, and a host implementation of the part of the CUDA runtime API TrainFlow calls
// (memory, streams, events, device queries, errors). See cuemu.h for what this is and its limits.
//
// Streams execute every operation when it is issued, so stream order, events and cross-stream waits
// hold trivially; what the emulator checks instead is that each call is valid (known stream/event,
// copies inside live allocations, frees of live allocations) and it reports misuse on stderr.
#include "base/float16.h"
#include "tests/emulator/cuemu.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#undef warpSize  // cudaDeviceProp::warpSize below

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>

struct CUstream_st {
  int flags = 0;
  int priority = 0;
};
struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
};

// ---- Fiber context switch -------------------------------------------------------------------------
// x86-64: saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in *save and continues on `next` (glibc's swapcontext also saves the
// signal mask with a system call on every switch, which made the emulator 3x slower). Elsewhere:
// ucontext.
#if defined(__x86_64__)
extern "C" void cuemu_switch(void** save, void* next);
asm(R"(
.text
.globl cuemu_switch
.type cuemu_switch,@function
cuemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size cuemu_switch, .-cuemu_switch
.section .note.GNU-stack,"",@progbits
.text
)");
#endif

namespace cuemu {
namespace {

constexpr size_t kDefaultSmem = 48 * 1024;
constexpr size_t kMaxSmemOptIn = 232448;  // sm_90: 227 KiB per block
constexpr size_t kFiberStack = 256 * 1024;
constexpr int kSlotBytes = 64;

[[noreturn]] void Fail(const std::string& what);

struct CpCopy {
  void* dst;
  const void* src;
  int bytes;
  int valid;
  long group;  // -1 while uncommitted
};

struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

struct Fiber {
  Context ctx;
  unsigned char* stack = nullptr;
  void* asan_fake_stack = nullptr;
  ThreadState st;
  bool done = false;
  long committed_groups = 0;
  std::vector<CpCopy> copies;
};

struct Warp {
  unsigned existing = 0;  // lanes present in the block
  unsigned exited = 0;
  unsigned waiting_mask = 0;  // mask of the collective in progress (0 when none)
  int arrived = 0;
  uint64_t generation = 0;
  unsigned char slots[32 * kSlotBytes];
};

struct Block {
  std::vector<Fiber>* fibers = nullptr;
  Context scheduler;
  const void* scheduler_stack = nullptr;  // (AddressSanitizer's fiber annotations)
  size_t scheduler_stack_size = 0;
  int live = 0;
  int barrier_arrived = 0;
  uint64_t barrier_generation = 0;
  uint64_t progress = 0;
  std::vector<Warp> warps;
  unsigned char* smem = nullptr;
  size_t smem_bytes = 0;
  KernelBody body = nullptr;
  void* closure = nullptr;
  const void* kernel = nullptr;
};

thread_local Block* t_block = nullptr;
thread_local Fiber* t_fiber = nullptr;

std::mutex& LaunchMutex() {
  static std::mutex m;
  return m;
}

struct Stacks {
  std::vector<std::unique_ptr<unsigned char[]>> stacks;
  unsigned char* Get(size_t i) {
    while (stacks.size() <= i) stacks.emplace_back(new unsigned char[kFiberStack]);
    return stacks[i].get();
  }
};
Stacks& FiberStacks() {
  static Stacks s;
  return s;
}

void SwitchTo(Context* save, Context* next) {
#if defined(__x86_64__)
  cuemu_switch(&save->sp, next->sp);
#else
  swapcontext(&save->uc, &next->uc);
#endif
}

// AddressSanitizer must be told about stack switches (or it reports the fibers' stacks as errors).
void EnteredFiber() {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(t_fiber->asan_fake_stack, &t_block->scheduler_stack, &t_block->scheduler_stack_size);
#endif
}

// Fiber -> scheduler; returns when the scheduler resumes this fiber. `exiting`: never resumed.
void Yield(bool exiting = false) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(exiting ? nullptr : &t_fiber->asan_fake_stack, t_block->scheduler_stack,
                                 t_block->scheduler_stack_size);
#endif
  SwitchTo(&t_fiber->ctx, &t_block->scheduler);
  EnteredFiber();
}

// Scheduler -> fiber f; returns when f yields or ends.
void Resume(Fiber& f) {
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kFiberStack);
#endif
  SwitchTo(&t_block->scheduler, &f.ctx);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

std::string Where() {
  if (t_fiber == nullptr) return "(host)";
  const ThreadState& s = t_fiber->st;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "kernel %p, block (%u,%u,%u), thread (%u,%u,%u)", t_block->kernel, s.block_idx.x,
                s.block_idx.y, s.block_idx.z, s.thread_idx.x, s.thread_idx.y, s.thread_idx.z);
  return buf;
}

void Fail(const std::string& what) {
  std::fprintf(stderr, "cuemu: %s [%s]\n", what.c_str(), Where().c_str());
  std::fflush(stderr);
  std::abort();
}

void ThreadExited() {
  Block& b = *t_block;
  Fiber& f = *t_fiber;
  f.done = true;
  --b.live;
  ++b.progress;
  Warp& w = b.warps[f.st.warp];
  const unsigned bit = 1u << f.st.lane;
  w.exited |= bit;
  if (w.waiting_mask & bit) Fail("a lane exited while the other lanes of its warp wait for it in a warp collective");
  if (b.barrier_arrived > 0 && b.barrier_arrived == b.live) {
    b.barrier_arrived = 0;
    ++b.barrier_generation;
  }
}

void FiberMain() {
  EnteredFiber();
  t_block->body(t_block->closure);
  ThreadExited();
  Yield(/*exiting=*/true);  // never resumed: the scheduler skips finished fibers
  std::abort();
}

void InitFiber(Fiber& f, unsigned char* stack, Block& b) {
#if defined(__SANITIZE_ADDRESS__)
  // A finished fiber never unwinds its frames: clear their redzones before the stack is reused.
  ASAN_UNPOISON_MEMORY_REGION(stack, kFiberStack);
#endif
#if defined(__x86_64__)
  // Stack, from the top: FiberMain as the return address (so that after `ret` the stack pointer is
  // 8 mod 16, as at any function entry), six callee-saved registers, then MXCSR and the x87 control word.
  auto top = (reinterpret_cast<uintptr_t>(stack) + kFiberStack) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top - 16);
  sp[0] = reinterpret_cast<uint64_t>(&FiberMain);
  sp -= 6;
  for (int i = 0; i < 6; ++i) sp[i] = 0;
  sp -= 1;
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  std::memcpy(reinterpret_cast<unsigned char*>(sp), &mxcsr, 4);
  std::memcpy(reinterpret_cast<unsigned char*>(sp) + 4, &fpucw, 2);
  f.ctx.sp = sp;
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp = stack;
  f.ctx.uc.uc_stack.ss_size = kFiberStack;
  f.ctx.uc.uc_link = &b.scheduler.uc;
  makecontext(&f.ctx.uc, FiberMain, 0);
#endif
}

void WarpBarrier(unsigned mask) {
  Block& b = *t_block;
  Fiber& f = *t_fiber;
  Warp& w = b.warps[f.st.warp];
  const unsigned expect = mask & w.existing;
  const unsigned bit = 1u << f.st.lane;
  if ((expect & bit) == 0) Fail("warp collective called by a lane that is not in its mask");
  if (expect & w.exited) Fail("warp collective whose mask names lanes that have exited (undefined on a GPU)");
  if (w.arrived == 0) {
    w.waiting_mask = expect;
  } else if (w.waiting_mask != expect) {
    Fail("lanes of one warp reached warp collectives with different masks");
  }
  ++b.progress;
  const uint64_t gen = w.generation;
  if (++w.arrived == __builtin_popcount(expect)) {
    w.arrived = 0;
    w.waiting_mask = 0;
    ++w.generation;
    return;
  }
  while (w.generation == gen) Yield();
}

bool InSmem(const void* p, size_t bytes) {
  const auto* c = static_cast<const unsigned char*>(p);
  return t_block->smem != nullptr && c >= t_block->smem && c + bytes <= t_block->smem + t_block->smem_bytes;
}

// ---- Device allocations ----
struct Allocations {
  std::mutex mu;
  std::map<uintptr_t, size_t> live;  // start -> bytes
  size_t total = 0;
};
Allocations& Allocs() {
  static Allocations a;
  return a;
}
}  // namespace
bool InAllocation(const void* p, size_t bytes) {
  auto& a = Allocs();
  std::lock_guard<std::mutex> lock(a.mu);
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto it = a.live.upper_bound(u);
  if (it == a.live.begin()) return false;
  --it;
  return u >= it->first && u + bytes <= it->first + it->second;
}
namespace {

// ---- Streams, events, errors ----
struct Registry {
  std::mutex mu;
  std::set<const void*> streams, events;
  std::map<const void*, int> max_dynamic_smem;
};
Registry& Reg() {
  static Registry r;
  return r;
}
thread_local cudaError_t t_last_error = cudaSuccess;
cudaError_t Record(cudaError_t e) {
  if (e != cudaSuccess) t_last_error = e;
  return e;
}
}  // namespace
bool ValidStream(cudaStream_t s) {
  if (s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread) return true;
  auto& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.streams.count(s) != 0;
}
namespace {
cudaError_t Misuse(const std::string& what, cudaError_t e) {
  std::fprintf(stderr, "cuemu: %s\n", what.c_str());
  return Record(e);
}

// CUEMU_ORDER=reverse runs each block's threads last to first between barriers (default: first to
// last). A thread runs ahead of every thread scheduled after it until its next barrier, so a missing
// barrier shows up when a thread reads what a later-scheduled thread has not written yet, or
// overwrites what it has not read yet; the two orders cover the two directions.
bool ReverseOrder() {
  static const bool reverse = [] {
    const char* env = std::getenv("CUEMU_ORDER");
    return env != nullptr && std::string(env) == "reverse";
  }();
  return reverse;
}

size_t DeviceMemoryBytes() {
  static const size_t bytes = [] {
    const char* env = std::getenv("CUEMU_DEVICE_MEMORY_MB");
    return static_cast<size_t>(env != nullptr ? std::atoll(env) : 16384) << 20;
  }();
  return bytes;
}

}  // namespace

ThreadState& Current() {
  if (t_fiber == nullptr) Fail("a device built-in (threadIdx, ...) used outside a kernel");
  return t_fiber->st;
}

void* DynamicShared() { return t_block->smem; }

void RunGrid(const void* kernel_id, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, KernelBody body,
             void* closure) {
  const long threads = long(block.x) * block.y * block.z;
  std::string bad;
  if (threads < 1 || threads > 1024 || block.z > 64) bad = "block of " + std::to_string(threads) + " threads";
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u)
    bad = "grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," + std::to_string(grid.z) + ")";
  if (!bad.empty()) {
    Misuse("invalid launch configuration: " + bad, cudaErrorInvalidConfiguration);
    return;
  }
  if (smem > kDefaultSmem) {
    int allowed = 0;
    {
      auto& r = Reg();
      std::lock_guard<std::mutex> lock(r.mu);
      auto it = r.max_dynamic_smem.find(kernel_id);
      if (it != r.max_dynamic_smem.end()) allowed = it->second;
    }
    if (smem > kMaxSmemOptIn || smem > size_t(allowed)) {
      Misuse("launch with " + std::to_string(smem) + " bytes of dynamic shared memory; the kernel allows " +
                 std::to_string(std::max<size_t>(allowed, kDefaultSmem)) +
                 " (cudaFuncSetAttribute(MaxDynamicSharedMemorySize) first; the device maximum is 232448)",
             cudaErrorInvalidValue);
      return;
    }
  }
  if (!ValidStream(stream)) {
    Misuse("launch on an unknown or destroyed stream", cudaErrorInvalidResourceHandle);
    return;
  }

  std::lock_guard<std::mutex> lock(LaunchMutex());
  std::vector<Fiber> fibers(threads);
  // Exactly `smem` bytes (an AddressSanitizer build then catches accesses past the end).
  struct AlignedDelete {
    void operator()(unsigned char* p) const { ::operator delete(p, std::align_val_t(128)); }
  };
  std::unique_ptr<unsigned char, AlignedDelete> smem_buf(
      smem > 0 ? static_cast<unsigned char*>(::operator new(smem, std::align_val_t(128))) : nullptr);
  unsigned char* smem_aligned = smem_buf.get();
  const int n_warps = static_cast<int>((threads + 31) / 32);
  Block b;
  b.fibers = &fibers;
  b.body = body;
  b.closure = closure;
  b.kernel = kernel_id;
  b.smem = smem_aligned;
  b.smem_bytes = smem;
  Block* saved_block = t_block;
  Fiber* saved_fiber = t_fiber;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        if (smem > 0) std::memset(smem_aligned, 0xFF, smem);
        b.live = static_cast<int>(threads);
        b.barrier_arrived = 0;
        b.warps.assign(n_warps, Warp{});
        for (int w = 0; w < n_warps; ++w) {
          const long lanes = std::min<long>(32, threads - 32L * w);
          b.warps[w].existing = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
        }
        t_block = &b;
        for (long t = 0; t < threads; ++t) {
          Fiber& f = fibers[t];
          f = Fiber{};
          f.st.block_idx = uint3{bx, by, bz};
          f.st.grid_dim = grid;
          f.st.block_dim = block;
          f.st.thread_idx = uint3{static_cast<unsigned>(t % block.x), static_cast<unsigned>((t / block.x) % block.y),
                                  static_cast<unsigned>(t / (long(block.x) * block.y))};
          f.st.linear = static_cast<int>(t);
          f.st.lane = static_cast<int>(t % 32);
          f.st.warp = static_cast<int>(t / 32);
          f.stack = FiberStacks().Get(t);
          InitFiber(f, f.stack, b);
        }
        // Warp by warp: each warp runs until all its threads wait at __syncthreads (or have ended)
        // before the next warp moves, so warps drift as far apart as a GPU lets them.
        long remaining = threads;
        while (remaining > 0) {
          const uint64_t before = b.progress;
          for (int wi = 0; wi < n_warps; ++wi) {
            const int w = ReverseOrder() ? n_warps - 1 - wi : wi;
            const long first = 32L * w, last = std::min<long>(threads, first + 32);
            for (;;) {
              const uint64_t warp_before = b.progress;
              for (long i = first; i < last; ++i) {
                Fiber& f = fibers[ReverseOrder() ? last - 1 - (i - first) : i];
                if (f.done) continue;
                t_fiber = &f;
                Resume(f);
              }
              if (b.progress == warp_before) break;
            }
          }
          remaining = 0;
          for (long t = 0; t < threads; ++t) remaining += fibers[t].done ? 0 : 1;
          if (remaining > 0 && b.progress == before) {
            t_fiber = nullptr;
            std::fprintf(stderr, "cuemu: deadlock in kernel %p block (%u,%u,%u): %ld threads wait at a barrier that "
                                 "the others never reach (divergent __syncthreads or warp collective)\n",
                         kernel_id, bx, by, bz, remaining);
            std::abort();
          }
        }
      }
    }
  }
  t_block = saved_block;
  t_fiber = saved_fiber;
}

void SyncThreads() {
  Block& b = *t_block;
  ++b.progress;
  const uint64_t gen = b.barrier_generation;
  if (++b.barrier_arrived == b.live) {
    b.barrier_arrived = 0;
    ++b.barrier_generation;
    return;
  }
  while (b.barrier_generation == gen) Yield();
}

const unsigned char* WarpGather(unsigned mask, const void* payload, size_t bytes) {
  Warp& w = t_block->warps[t_fiber->st.warp];
  std::memcpy(w.slots + kSlotBytes * t_fiber->st.lane, payload, bytes);
  WarpBarrier(mask);
  return w.slots;
}
void WarpRelease(unsigned mask) { WarpBarrier(mask); }

unsigned Ballot(unsigned mask, bool pred) {
  const unsigned char* all = WarpGather(mask, &pred, 1);
  const unsigned expect = mask & t_block->warps[t_fiber->st.warp].existing;
  unsigned r = 0;
  for (int l = 0; l < 32; ++l)
    if ((expect >> l & 1u) && all[kSlotBytes * l] != 0) r |= 1u << l;
  WarpRelease(mask);
  return r;
}

namespace {
uint16_t LoadB16(const unsigned char* row, int col) {
  uint16_t v;
  std::memcpy(&v, row + 2 * col, 2);
  return v;
}
float Bf16Bits(uint32_t packed, int half) {
  return tf::Bf16ToFloat(static_cast<uint16_t>(half == 0 ? (packed & 0xffffu) : (packed >> 16)));
}
}  // namespace

void LdMatrixX4(uint32_t (&r)[4], const void* row_address, bool trans) {
  if (reinterpret_cast<uintptr_t>(row_address) % 16 != 0) Fail("ldmatrix row address not 16-byte aligned");
  if (!InSmem(row_address, 16)) Fail("ldmatrix row address outside the block's dynamic shared memory");
  const unsigned char* all = WarpGather(0xffffffffu, &row_address, sizeof(row_address));
  const int lane = t_fiber->st.lane, g = lane / 4, q = lane % 4;
  auto row = [&](int m, int i) {
    const unsigned char* p;
    std::memcpy(&p, all + kSlotBytes * (8 * m + i), sizeof(p));
    return p;
  };
  for (int m = 0; m < 4; ++m) {
    uint16_t lo, hi;
    if (!trans) {  // lane gets row g, columns 2q, 2q+1 of matrix m
      lo = LoadB16(row(m, g), 2 * q);
      hi = LoadB16(row(m, g), 2 * q + 1);
    } else {  // transposed: rows 2q, 2q+1 of column g
      lo = LoadB16(row(m, 2 * q), g);
      hi = LoadB16(row(m, 2 * q + 1), g);
    }
    r[m] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  WarpRelease(0xffffffffu);
}

void MmaM16N8K16Bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  struct Operands {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b0, b1}};
  const unsigned char* all = WarpGather(0xffffffffu, &mine, sizeof(mine));
  auto ops = [&](int lane) {
    Operands o;
    std::memcpy(&o, all + kSlotBytes * lane, sizeof(o));
    return o;
  };
  // A (16x16, row): element (r, k) is in lane (r%8)*4 + (k%8)/2, register (r>=8) + 2*(k>=8), half k%2.
  // B (16x8, col): element (k, n) is in lane n*4 + (k%8)/2, register (k>=8), half k%2.
  auto A = [&](int r, int k) { return Bf16Bits(ops((r % 8) * 4 + (k % 8) / 2).a[(r >= 8) + 2 * (k >= 8)], k % 2); };
  auto B = [&](int k, int n) { return Bf16Bits(ops(n * 4 + (k % 8) / 2).b[k >= 8], k % 2); };
  const int lane = t_fiber->st.lane, g = lane / 4, q = lane % 4;
  float d[4];
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), n = 2 * q + (i % 2);
    float acc = 0.f;
    for (int k = 0; k < 16; ++k) acc += A(r, k) * B(k, n);
    d[i] = c[i] + acc;
  }
  WarpRelease(0xffffffffu);
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

namespace {
void PerformCopy(const CpCopy& c) {
  if (c.valid > 0) std::memcpy(c.dst, c.src, c.valid);
  if (c.valid < c.bytes) std::memset(static_cast<unsigned char*>(c.dst) + c.valid, 0, c.bytes - c.valid);
}
// CUEMU_CPASYNC=eager completes each cp.async when it is issued (the earliest the hardware may):
// a buffer refilled while other threads still read it then shows up. Default ("deferred"): at
// the covering cp.async.wait_group (the latest): a read before the wait shows up.
bool EagerCopies() {
  static const bool eager = [] {
    const char* env = std::getenv("CUEMU_CPASYNC");
    return env != nullptr && std::string(env) == "eager";
  }();
  return eager;
}
}  // namespace

void CpAsync(void* smem, const void* gmem, int bytes, int valid_bytes) {
  if (reinterpret_cast<uintptr_t>(smem) % bytes != 0) Fail("cp.async shared-memory destination misaligned");
  if (!InSmem(smem, bytes)) Fail("cp.async destination outside the block's dynamic shared memory");
  if (valid_bytes > 0 && !InAllocation(gmem, valid_bytes))
    Fail("cp.async reads global memory outside every device allocation");
  if (EagerCopies()) {
    PerformCopy(CpCopy{smem, gmem, bytes, valid_bytes, -1});
    return;
  }
  t_fiber->copies.push_back(CpCopy{smem, gmem, bytes, valid_bytes, -1});
}
void CpAsyncCommit() {
  for (CpCopy& c : t_fiber->copies)
    if (c.group < 0) c.group = t_fiber->committed_groups;
  ++t_fiber->committed_groups;
}
void CpAsyncWait(int pending) {
  Fiber& f = *t_fiber;
  const long complete_below = f.committed_groups - pending;  // groups [0, complete_below) must be done
  std::vector<CpCopy> keep;
  for (const CpCopy& c : f.copies) {
    if (c.group >= 0 && c.group < complete_below) {
      PerformCopy(c);
    } else {
      keep.push_back(c);
    }
  }
  f.copies.swap(keep);
}

}  // namespace cuemu

// ==== CUDA runtime API (host side) ====================================================================
using cuemu::InAllocation;
using cuemu::Misuse;
using cuemu::Record;

extern "C" {

// CUEMU_DEVICES (default 1) emulated devices, all the same host memory: enough for one rank per
// device under mpirun.
static int EmulatedDevices() {
  static const int n = [] {
    const char* env = std::getenv("CUEMU_DEVICES");
    return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 1;
  }();
  return n;
}
static thread_local int t_device = 0;
cudaError_t cudaGetDeviceCount(int* count) {
  *count = EmulatedDevices();
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = t_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= EmulatedDevices())
    return Misuse("cudaSetDevice(" + std::to_string(device) + ")", cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (device < 0 || device >= EmulatedDevices()) return Record(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof(*p));
  std::snprintf(p->name, sizeof(p->name), "cuemu CPU emulator (sm_90)");
  p->totalGlobalMem = cuemu::DeviceMemoryBytes();
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = cuemu::kMaxSmemOptIn;
  p->sharedMemPerMultiprocessor = 233472;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  p->l2CacheSize = 50 * 1024 * 1024;
  p->maxThreadsPerMultiProcessor = 2048;
  p->memoryBusWidth = 6144;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  if (device < 0 || device >= EmulatedDevices()) return Record(cudaErrorInvalidDevice);
  if (id == nullptr || len < 13) return Record(cudaErrorInvalidValue);
  std::snprintf(id, static_cast<size_t>(len), "0000:%02x:00.0", 0xe0 + device);  // no real device there
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp p;
  cudaGetDeviceProperties(&p, device);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = p.multiProcessorCount; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(p.sharedMemPerBlockOptin); break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(p.sharedMemPerBlock); break;
    case cudaDevAttrComputeCapabilityMajor: *value = p.major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = p.minor; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrL2CacheSize: *value = p.l2CacheSize; break;
    default: *value = 0; break;
  }
  return cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetLastError() {
  const cudaError_t e = cuemu::t_last_error;
  cuemu::t_last_error = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError() { return cuemu::t_last_error; }
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    default: return "cudaError (cuemu)";
  }
}
const char* cudaGetErrorString(cudaError_t e) { return cudaGetErrorName(e); }

cudaError_t cudaMalloc(void** p, size_t bytes) {
  auto& a = cuemu::Allocs();
  {
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.total + bytes > cuemu::DeviceMemoryBytes()) {
      *p = nullptr;
      return Record(cudaErrorMemoryAllocation);
    }
  }
  // 256-byte aligned like cudaMalloc, but exactly `bytes` long, so that an AddressSanitizer build
  // catches a kernel reading or writing past the end of a buffer.
  void* mem = ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(256), std::nothrow);
  if (mem == nullptr) return Record(cudaErrorMemoryAllocation);
  std::memset(mem, 0xFF, bytes);  // never zero: kernels that read memory nobody wrote see NaN
  std::lock_guard<std::mutex> lock(a.mu);
  a.live[reinterpret_cast<uintptr_t>(mem)] = bytes;
  a.total += bytes;
  *p = mem;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  auto& a = cuemu::Allocs();
  {
    std::lock_guard<std::mutex> lock(a.mu);
    auto it = a.live.find(reinterpret_cast<uintptr_t>(p));
    if (it == a.live.end()) return Misuse("cudaFree of a pointer that is not a live allocation", cudaErrorInvalidValue);
    a.total -= it->second;
    a.live.erase(it);
  }
  ::operator delete(p, std::align_val_t(256));
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t s) {
  if (!cuemu::ValidStream(s)) return Misuse("cudaMallocAsync on an unknown stream", cudaErrorInvalidResourceHandle);
  return cudaMalloc(p, bytes);
}
cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  if (!cuemu::ValidStream(s)) return Misuse("cudaFreeAsync on an unknown stream", cudaErrorInvalidResourceHandle);
  return cudaFree(p);
}
// Page-locked host memory is ordinary host memory here (not counted as device memory).
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int flags) {
  (void)flags;
  *p = ::operator new(std::max<size_t>(bytes, 1), std::align_val_t(256), std::nothrow);
  return *p != nullptr ? cudaSuccess : Record(cudaErrorMemoryAllocation);
}
cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }
cudaError_t cudaFreeHost(void* p) {
  if (p != nullptr) ::operator delete(p, std::align_val_t(256));
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  auto& a = cuemu::Allocs();
  std::lock_guard<std::mutex> lock(a.mu);
  *total_bytes = cuemu::DeviceMemoryBytes();
  *free_bytes = *total_bytes - a.total;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  if (!cuemu::ValidStream(s)) return Misuse("cudaMemcpyAsync on an unknown stream", cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_dev && !InAllocation(dst, bytes))
    return Misuse("cudaMemcpy: destination range (" + std::to_string(bytes) + " bytes) is not inside a device allocation",
                  cudaErrorInvalidValue);
  if (src_dev && !InAllocation(src, bytes))
    return Misuse("cudaMemcpy: source range (" + std::to_string(bytes) + " bytes) is not inside a device allocation",
                  cudaErrorInvalidValue);
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t s) {
  if (!cuemu::ValidStream(s)) return Misuse("cudaMemsetAsync on an unknown stream", cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  if (!InAllocation(p, bytes))
    return Misuse("cudaMemset: range (" + std::to_string(bytes) + " bytes) is not inside a device allocation",
                  cudaErrorInvalidValue);
  std::memset(p, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemset(void* p, int value, size_t bytes) { return cudaMemsetAsync(p, value, bytes, nullptr); }

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int priority) {
  auto* st = new CUstream_st{static_cast<int>(flags), priority};
  auto& r = cuemu::Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.streams.insert(st);
  *s = st;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) { return cudaStreamCreateWithPriority(s, flags, 0); }
cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithPriority(s, 0, 0); }
}  // extern "C"
namespace {
// Removes a stream or event from the registry and deletes it; an unknown handle is misuse.
template <typename T>
cudaError_t DestroyHandle(std::set<const void*> cuemu::Registry::*which, T* h, const char* call) {
  auto& r = cuemu::Reg();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if ((r.*which).erase(h) == 0) return Misuse(std::string(call) + " of an unknown handle", cudaErrorInvalidResourceHandle);
  }
  delete h;
  return cudaSuccess;
}
}  // namespace
extern "C" {
cudaError_t cudaStreamDestroy(cudaStream_t s) { return DestroyHandle(&cuemu::Registry::streams, s, "cudaStreamDestroy"); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return cuemu::ValidStream(s) ? cudaSuccess
                               : Misuse("cudaStreamSynchronize on an unknown stream", cudaErrorInvalidResourceHandle);
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return cudaStreamSynchronize(s); }

namespace {
bool ValidEvent(cudaEvent_t e) {
  auto& r = cuemu::Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.events.count(e) != 0;
}
}  // namespace
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags) {
  auto* ev = new CUevent_st{};
  ev->flags = flags;
  auto& r = cuemu::Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.insert(ev);
  *e = ev;
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { return DestroyHandle(&cuemu::Registry::events, e, "cudaEventDestroy"); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!ValidEvent(e)) return Misuse("cudaEventRecord of an unknown event", cudaErrorInvalidResourceHandle);
  if (!cuemu::ValidStream(s)) return Misuse("cudaEventRecord on an unknown stream", cudaErrorInvalidResourceHandle);
  e->recorded = true;
  e->when = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return ValidEvent(e) ? cudaSuccess : Misuse("cudaEventSynchronize of an unknown event", cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
  if (!ValidEvent(e)) return Misuse("cudaStreamWaitEvent on an unknown event", cudaErrorInvalidResourceHandle);
  if (!cuemu::ValidStream(s)) return Misuse("cudaStreamWaitEvent on an unknown stream", cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ValidEvent(start) || !ValidEvent(end))
    return Misuse("cudaEventElapsedTime of an unknown event", cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) return Record(cudaErrorInvalidResourceHandle);
  if (!start->recorded || !end->recorded) return Record(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || size_t(value) > cuemu::kMaxSmemOptIn)
      return Misuse("cudaFuncSetAttribute(MaxDynamicSharedMemorySize, " + std::to_string(value) +
                        ") above the device's 232448",
                    cudaErrorInvalidValue);
    auto& r = cuemu::Reg();
    std::lock_guard<std::mutex> lock(r.mu);
    r.max_dynamic_smem[func] = value;
  }
  return cudaSuccess;
}

}  // extern "C"
