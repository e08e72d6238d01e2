// Fused causal self-attention (kernels/flash_attention.h), FlashAttention-2 style: online softmax,
// the (T,T) matrices never stored, only the (B,NH,T) log-sum-exp; scores in base 2 inside.
//
// Forward: one CTA per (b,h, query tile), heaviest tiles first, walking the key tiles up to the
// diagonal (only the diagonal tile is masked). Backward, deterministic, no atomics: RowDotKernel
// (D = rowsum(dO * O)), pass 1 per key tile (dK, dV), pass 2 per query tile (dQ), which recomputes
// S and dP (7 tile products instead of 5) for a fixed summation order and no fp32 dQ scratch.
// Two implementations of each kernel: tensor cores (bf16, hs 64/128: 4 warps, 64-row tiles,
// mma.sync.m16n8k16 on ldmatrix operands, cp.async double buffering, P and dS kept in registers)
// and SIMT (fp32 storage, any hs <= 128, and the kSimt fallback: 32-row fp32 tiles). Rows past T
// are loaded as zeros, masked, never stored.
// Algorithm, tile layouts, shared memory, registers: docs/cuda.md, "Flash attention".
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/cuda_common.cuh"
#include "kernels/flash_attention.h"

namespace tf::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 128;  // every flash kernel: 4 warps
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr size_t kDefaultSmem = 48 * 1024;  // above this a kernel must opt in
constexpr size_t kScratchAlign = 256;

// ---- PTX wrappers (sm_80+) ------------------------------------------------------------------------
#if defined(TRAINFLOW_CUDA_EMULATION)
// tests/emulator (cuemu): the same instructions executed by the CPU emulator, with PTX semantics.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  ::cuemu::CpAsync(smem, gmem, 16, valid ? 16 : 0);
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  ::cuemu::CpAsync(smem, gmem, 4, valid ? 4 : 0);
}
__device__ __forceinline__ void CpAsyncCommit() { ::cuemu::CpAsyncCommit(); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  ::cuemu::CpAsyncWait(N);
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* p) { ::cuemu::LdMatrixX4(r, p, false); }
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* p) { ::cuemu::LdMatrixX4(r, p, true); }
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  ::cuemu::MmaM16N8K16Bf16(c, a, b0, b1);
}
#else

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, asynchronously; zero-fills (reads nothing) when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col). Fragment layouts (PTX ISA, mma.m16n8k16;
// g = lane/4, q = lane%4): a[0] = A[g][2q..2q+1], a[1] = A[g+8][2q..], a[2] = A[g][2q+8..],
// a[3] = A[g+8][2q+8..]; b0 = B[2q..2q+1][g], b1 = B[2q+8..2q+9][g]; c[0..1] = C[g][2q..2q+1],
// c[2..3] = C[g+8][2q..2q+1]. The lower index sits in the lower 16 bits of each register.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif  // TRAINFLOW_CUDA_EMULATION
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  uint32_t r;
  memcpy(&r, &v, 4);
  return r;
}

// ---- Tensor-core building blocks (one warp; tiles in shared memory, row stride S elements) --------

// A fragment (16x16) of the row-major tile rows m0.., columns k0..: ldmatrix matrices 0..3 are
// (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15); lane l addresses row l%8 of matrix l/8.
template <int S>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const bf16* tile, int m0, int k0, int lane) {
  LdMatrixX4(a, tile + (m0 + (lane & 7) + ((lane >> 3) & 1) * 8) * S + k0 + (lane >> 4) * 8);
}
// B fragments for B = tile^T, the tile stored [n][k] (e.g. K for S = Q K^T): b[0], b[1] for n-block
// n0/8 and b[2], b[3] for n-block n0/8 + 1, at k-step k0. Matrices: (n 0-7, k 0-7), (n 0-7, k 8-15),
// (n 8-15, k 0-7), (n 8-15, k 8-15). Non-transposed ldmatrix gives lane l the elements
// tile[n0 + l/4][k0 + 2(l%4)..], which is b0's layout (B[k][n] = tile[n][k]).
template <int S>
__device__ __forceinline__ void LoadBt(uint32_t (&b)[4], const bf16* tile, int n0, int k0, int lane) {
  LdMatrixX4(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * S + k0 + ((lane >> 3) & 1) * 8);
}
// B fragments for B = tile, the tile stored [k][n] (e.g. V for O = P V): same register order as
// LoadBt. Matrices: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15), loaded
// transposed so that lane l holds tile[k0 + 2(l%4)..][n0 + l/4] (b0's layout).
template <int S>
__device__ __forceinline__ void LoadB(uint32_t (&b)[4], const bf16* tile, int k0, int n0, int lane) {
  LdMatrixX4Trans(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * S + n0 + (lane >> 4) * 8);
}

// acc (16 x 8NB) += A (16 x 16KS, register fragments) * tile^T, tile [8NB rows][16KS cols].
template <int NB, int KS, int S>
__device__ __forceinline__ void MmaRegABt(float (&acc)[NB][4], const uint32_t (&a)[KS][4], const bf16* tile,
                                          int lane) {
  static_assert(NB % 2 == 0, "n-blocks come in pairs");
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
    for (int nb = 0; nb < NB; nb += 2) {
      uint32_t b[4];
      LoadBt<S>(b, tile, nb * 8, ks * 16, lane);
      Mma(acc[nb], a[ks], b[0], b[1]);
      Mma(acc[nb + 1], a[ks], b[2], b[3]);
    }
  }
}
// acc (16 x 8NB) += A (rows m0..m0+15 of tile_a, 16KS columns, read per k-step) * tile_b^T.
template <int NB, int KS, int S>
__device__ __forceinline__ void MmaSmemABt(float (&acc)[NB][4], const bf16* tile_a, int m0, const bf16* tile_b,
                                           int lane) {
  static_assert(NB % 2 == 0, "n-blocks come in pairs");
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    uint32_t a[4];
    LoadA<S>(a, tile_a, m0, ks * 16, lane);
#pragma unroll
    for (int nb = 0; nb < NB; nb += 2) {
      uint32_t b[4];
      LoadBt<S>(b, tile_b, nb * 8, ks * 16, lane);
      Mma(acc[nb], a, b[0], b[1]);
      Mma(acc[nb + 1], a, b[2], b[3]);
    }
  }
}
// acc (16 x 8NB) += A (16 x 16KS, register fragments) * tile, tile [16KS rows][8NB cols].
template <int NB, int KS, int S>
__device__ __forceinline__ void MmaRegAB(float (&acc)[NB][4], const uint32_t (&a)[KS][4], const bf16* tile,
                                         int lane) {
  static_assert(NB % 2 == 0, "n-blocks come in pairs");
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
    for (int nb = 0; nb < NB; nb += 2) {
      uint32_t b[4];
      LoadB<S>(b, tile, ks * 16, nb * 8, lane);
      Mma(acc[nb], a[ks], b[0], b[1]);
      Mma(acc[nb + 1], a[ks], b[2], b[3]);
    }
  }
}
// Accumulator tile (16 x 16KS fp32, 2KS n-blocks) -> A fragments (bf16) of the same 16 x 16KS matrix.
template <int KS>
__device__ __forceinline__ void AccToA(uint32_t (&a)[KS][4], const float (&c)[2 * KS][4]) {
#pragma unroll
  for (int k = 0; k < KS; ++k) {
    a[k][0] = PackBf16(c[2 * k][0], c[2 * k][1]);
    a[k][1] = PackBf16(c[2 * k][2], c[2 * k][3]);
    a[k][2] = PackBf16(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[k][3] = PackBf16(c[2 * k + 1][2], c[2 * k + 1][3]);
  }
}
template <int N>
__device__ __forceinline__ void Zero(float (&acc)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

// Starts the copy of rows [0, ROWS) of a head slice into a padded smem tile [ROWS][HS + 8]: row r is
// at g + r * ld (elements). Rows >= valid are zero-filled (their source is never read).
template <int ROWS, int HS>
__device__ __forceinline__ void LoadTileAsync(bf16* tile, const bf16* g, long ld, int valid) {
  constexpr int kChunks = HS / 8;  // 16-byte chunks per row
  constexpr int S = HS + 8;
  for (int i = threadIdx.x; i < ROWS * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid;
    CpAsync16(tile + r * S + c * 8, ok ? g + r * ld + c * 8 : g, ok);
  }
}
// Starts the copy of n floats (entries >= valid zero-filled).
__device__ __forceinline__ void LoadVecAsync(float* dst, const float* src, int n, int valid) {
  for (int i = threadIdx.x; i < n; i += kThreads) CpAsync4(dst + i, i < valid ? src + i : src, i < valid);
}

// ---- Tensor-core kernels ---------------------------------------------------------------------------

constexpr int kMmaTile = 64;  // query rows per forward / dQ CTA, key rows per dK,dV CTA, key tile of fwd/dQ
// Query rows per tile in the dK,dV pass (smaller at hs 128 to stay within 255 registers).
constexpr int BwdQueryTile(int hs) { return hs == 64 ? 64 : 32; }

template <int HS>
constexpr size_t ForwardMmaSmem() {
  return size_t(kMmaTile + 4 * kMmaTile) * (HS + 8) * sizeof(bf16);  // Q, 2x K, 2x V
}
template <int HS>
constexpr size_t BackwardKVMmaSmem() {
  constexpr int R = BwdQueryTile(HS);
  return size_t(2 * kMmaTile + 4 * R) * (HS + 8) * sizeof(bf16) + 4 * R * sizeof(float);  // K, V, 2x(Q, dO, lse, D)
}
template <int HS>
constexpr size_t BackwardQMmaSmem() {
  return size_t(2 * kMmaTile + 4 * kMmaTile) * (HS + 8) * sizeof(bf16);  // Q, dO, 2x K, 2x V
}

// grid (B*NH, ceil(T/64)); block kThreads; dynamic smem ForwardMmaSmem<HS>().
template <int HS>
__global__ void __launch_bounds__(kThreads) FlashForwardMmaKernel(bf16* out, float* lse, const bf16* qkv, int T,
                                                                  int NH, float scale_log2) {
  constexpr int S = HS + 8, R = kMmaTile;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + R * S;      // [2][R][S]
  bf16* Vs = Ks + 2 * R * S;  // [2][R][S]

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int qt = gridDim.y - 1 - blockIdx.y;  // last (longest) query tiles first
  const int q0 = qt * R;
  const int C = NH * HS;
  const long ld = 3L * C;
  const bf16* base = qkv + long(b) * T * ld + h * HS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_kt = qt + 1;  // key tiles 0..qt

  LoadTileAsync<R, HS>(Qs, base + q0 * ld, ld, T - q0);
  LoadTileAsync<R, HS>(Ks, base + C, ld, T);
  LoadTileAsync<R, HS>(Vs, base + 2 * C, ld, T);
  CpAsyncCommit();

  uint32_t qa[HS / 16][4];
  float o[HS / 8][4];
  Zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const int row0 = q0 + warp * 16 + lane / 4;  // this thread's rows: row0 (c[0..1]) and row0 + 8 (c[2..3])

  for (int j = 0; j < n_kt; ++j) {
    const int cur = j & 1;
    if (j + 1 < n_kt) {
      const int k1 = (j + 1) * R;
      LoadTileAsync<R, HS>(Ks + (cur ^ 1) * R * S, base + C + k1 * ld, ld, T - k1);
      LoadTileAsync<R, HS>(Vs + (cur ^ 1) * R * S, base + 2 * C + k1 * ld, ld, T - k1);
    }
    CpAsyncCommit();  // (possibly empty: keeps the group count uniform)
    CpAsyncWait<1>();
    __syncthreads();
    if (j == 0) {
#pragma unroll
      for (int ks = 0; ks < HS / 16; ++ks) LoadA<S>(qa[ks], Qs, warp * 16, ks * 16, lane);
    }
    const bf16* Kc = Ks + cur * R * S;
    const bf16* Vc = Vs + cur * R * S;

    float s[R / 8][4];
    Zero(s);
    MmaRegABt<R / 8, HS / 16, S>(s, qa, Kc, lane);

    // Scale to base 2, mask the diagonal tile, online softmax.
    const bool diag = j == qt;
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nb = 0; nb < R / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nb][e] * scale_log2;
        const int key = j * R + nb * 8 + (lane % 4) * 2 + (e & 1);
        if (diag && key > row0 + (e >> 1) * 8) x = -INFINITY;
        s[nb][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float alpha[2], mu[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      mu[r] = mx[r] == -INFINITY ? 0.0f : mx[r];  // (never -inf: every row has an unmasked key)
      alpha[r] = exp2f(m[r] - mu[r]);
      m[r] = mx[r];
    }
    float rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nb = 0; nb < R / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(s[nb][e] - mu[e >> 1]);
        s[nb][e] = p;
        rs[e >> 1] += p;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + rs[r];  // per-thread partial sums (same alpha per quad)
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
      o[nd][0] *= alpha[0];
      o[nd][1] *= alpha[0];
      o[nd][2] *= alpha[1];
      o[nd][3] *= alpha[1];
    }
    uint32_t pa[R / 16][4];
    AccToA<R / 16>(pa, s);
    MmaRegAB<HS / 8, R / 16, S>(o, pa, Vc, lane);
    __syncthreads();  // every warp is done with buffer `cur` before the next iteration refills it
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int row = row0 + r * 8;
    if (row >= T) continue;
    const float inv = 1.0f / l[r];
    bf16* dst = out + (long(b) * T + row) * C + h * HS + (lane % 4) * 2;
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
      *reinterpret_cast<__nv_bfloat162*>(dst + nd * 8) =
          __floats2bfloat162_rn(o[nd][2 * r] * inv, o[nd][2 * r + 1] * inv);
    }
    if (lane % 4 == 0) lse[long(bh) * T + row] = (m[r] + log2f(l[r])) * kLn2;
  }
}

// dK, dV. grid (B*NH, ceil(T/64)) — key tile = blockIdx.y (low tiles have the most query tiles, so
// they start first); block kThreads; dynamic smem BackwardKVMmaSmem<HS>(). Warp w owns keys
// k0 + 16w .. k0 + 16w + 15; query tiles of QR rows.
template <int HS>
__global__ void __launch_bounds__(kThreads) FlashBackwardKVMmaKernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                                     const float* lse, const float* dsum, int T,
                                                                     int NH, float scale, float scale_log2) {
  constexpr int S = HS + 8, KR = kMmaTile, QR = BwdQueryTile(HS);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + KR * S;
  bf16* Qs = Vs + KR * S;       // [2][QR][S]
  bf16* dOs = Qs + 2 * QR * S;  // [2][QR][S]
  float* Ls = reinterpret_cast<float*>(dOs + 2 * QR * S);  // [2][QR]
  float* Ds = Ls + 2 * QR;                                 // [2][QR]

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int k0 = blockIdx.y * KR;
  const int C = NH * HS;
  const long ld = 3L * C;
  const bf16* qbase = qkv + long(b) * T * ld + h * HS;
  const bf16* obase = dout + long(b) * T * C + h * HS;
  const float* lse_bh = lse + long(bh) * T;
  const float* d_bh = dsum + long(bh) * T;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i0 = k0 / QR, n_qt = (T + QR - 1) / QR;

  auto load_queries = [&](int i, int buf) {
    const int q = i * QR;
    LoadTileAsync<QR, HS>(Qs + buf * QR * S, qbase + q * ld, ld, T - q);
    LoadTileAsync<QR, HS>(dOs + buf * QR * S, obase + long(q) * C, C, T - q);
    LoadVecAsync(Ls + buf * QR, lse_bh + q, QR, T - q);
    LoadVecAsync(Ds + buf * QR, d_bh + q, QR, T - q);
  };
  LoadTileAsync<KR, HS>(Ks, qbase + C + k0 * ld, ld, T - k0);
  LoadTileAsync<KR, HS>(Vs, qbase + 2 * C + k0 * ld, ld, T - k0);
  load_queries(i0, 0);
  CpAsyncCommit();

  float dk[HS / 8][4], dv[HS / 8][4];
  Zero(dk);
  Zero(dv);
  const int key0 = k0 + warp * 16 + lane / 4;  // rows of the transposed tiles: keys key0, key0 + 8

  for (int i = i0; i < n_qt; ++i) {
    const int cur = (i - i0) & 1;
    if (i + 1 < n_qt) load_queries(i + 1, cur ^ 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const bf16* Qc = Qs + cur * QR * S;
    const bf16* dOc = dOs + cur * QR * S;
    const float* Lc = Ls + cur * QR;
    const float* Dc = Ds + cur * QR;
    const int q0 = i * QR;

    // P^T = exp(S^T - lse): rows = this warp's 16 keys, columns = the tile's QR queries.
    float pt[QR / 8][4];
    Zero(pt);
    MmaSmemABt<QR / 8, HS / 16, S>(pt, Ks, warp * 16, Qc, lane);
#pragma unroll
    for (int nb = 0; nb < QR / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = nb * 8 + (lane % 4) * 2 + (e & 1);
        const int query = q0 + ql, key = key0 + (e >> 1) * 8;
        pt[nb][e] = (query >= key && query < T) ? exp2f(pt[nb][e] * scale_log2 - Lc[ql] * kLog2e) : 0.0f;
      }
    }
    uint32_t pa[QR / 16][4];
    AccToA<QR / 16>(pa, pt);
    // dP^T = V dO^T; dS^T = P^T (dP^T - D).
    float dst[QR / 8][4];
    Zero(dst);
    MmaSmemABt<QR / 8, HS / 16, S>(dst, Vs, warp * 16, dOc, lane);
#pragma unroll
    for (int nb = 0; nb < QR / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ql = nb * 8 + (lane % 4) * 2 + (e & 1);
        dst[nb][e] = pt[nb][e] * (dst[nb][e] - Dc[ql]);
      }
    }
    uint32_t dsa[QR / 16][4];
    AccToA<QR / 16>(dsa, dst);
    // dV += P^T dO; dK += dS^T Q.
    MmaRegAB<HS / 8, QR / 16, S>(dv, pa, dOc, lane);
    MmaRegAB<HS / 8, QR / 16, S>(dk, dsa, Qc, lane);
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = key0 + r * 8;
    if (key >= T) continue;
    bf16* dst_k = dqkv + (long(b) * T + key) * ld + C + h * HS + (lane % 4) * 2;
    bf16* dst_v = dst_k + C;
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
      *reinterpret_cast<__nv_bfloat162*>(dst_k + nd * 8) =
          __floats2bfloat162_rn(dk[nd][2 * r] * scale, dk[nd][2 * r + 1] * scale);
      *reinterpret_cast<__nv_bfloat162*>(dst_v + nd * 8) = __floats2bfloat162_rn(dv[nd][2 * r], dv[nd][2 * r + 1]);
    }
  }
}

// dQ. grid (B*NH, ceil(T/64)), longest query tiles first; block kThreads; dynamic smem
// BackwardQMmaSmem<HS>(). Warp w owns query rows q0 + 16w .. q0 + 16w + 15.
template <int HS>
__global__ void __launch_bounds__(kThreads) FlashBackwardQMmaKernel(bf16* dqkv, const bf16* dout, const bf16* qkv,
                                                                    const float* lse, const float* dsum, int T,
                                                                    int NH, float scale, float scale_log2) {
  constexpr int S = HS + 8, R = kMmaTile;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* dOs = Qs + R * S;
  bf16* Ks = dOs + R * S;     // [2][R][S]
  bf16* Vs = Ks + 2 * R * S;  // [2][R][S]

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * R;
  const int C = NH * HS;
  const long ld = 3L * C;
  const bf16* base = qkv + long(b) * T * ld + h * HS;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n_kt = qt + 1;

  LoadTileAsync<R, HS>(Qs, base + q0 * ld, ld, T - q0);
  LoadTileAsync<R, HS>(dOs, dout + (long(b) * T + q0) * C + h * HS, C, T - q0);
  LoadTileAsync<R, HS>(Ks, base + C, ld, T);
  LoadTileAsync<R, HS>(Vs, base + 2 * C, ld, T);
  CpAsyncCommit();

  const int row0 = q0 + warp * 16 + lane / 4;
  float lse2[2], drow[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + r * 8;
    lse2[r] = row < T ? lse[long(bh) * T + row] * kLog2e : 0.0f;
    drow[r] = row < T ? dsum[long(bh) * T + row] : 0.0f;
  }
  float dq[HS / 8][4];
  Zero(dq);

  for (int j = 0; j < n_kt; ++j) {
    const int cur = j & 1;
    if (j + 1 < n_kt) {
      const int k1 = (j + 1) * R;
      LoadTileAsync<R, HS>(Ks + (cur ^ 1) * R * S, base + C + k1 * ld, ld, T - k1);
      LoadTileAsync<R, HS>(Vs + (cur ^ 1) * R * S, base + 2 * C + k1 * ld, ld, T - k1);
    }
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const bf16* Kc = Ks + cur * R * S;
    const bf16* Vc = Vs + cur * R * S;

    float p[R / 8][4];
    Zero(p);
    MmaSmemABt<R / 8, HS / 16, S>(p, Qs, warp * 16, Kc, lane);
    const bool diag = j == qt;
#pragma unroll
    for (int nb = 0; nb < R / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j * R + nb * 8 + (lane % 4) * 2 + (e & 1);
        const bool masked = diag && key > row0 + (e >> 1) * 8;
        p[nb][e] = masked ? 0.0f : exp2f(p[nb][e] * scale_log2 - lse2[e >> 1]);
      }
    }
    float ds[R / 8][4];
    Zero(ds);
    MmaSmemABt<R / 8, HS / 16, S>(ds, dOs, warp * 16, Vc, lane);
#pragma unroll
    for (int nb = 0; nb < R / 8; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nb][e] = p[nb][e] * (ds[nb][e] - drow[e >> 1]);
    }
    uint32_t dsa[R / 16][4];
    AccToA<R / 16>(dsa, ds);
    MmaRegAB<HS / 8, R / 16, S>(dq, dsa, Kc, lane);  // dQ += dS K (K tile as [key][dim])
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + r * 8;
    if (row >= T) continue;
    bf16* dst = dqkv + (long(b) * T + row) * ld + h * HS + (lane % 4) * 2;
#pragma unroll
    for (int nd = 0; nd < HS / 8; ++nd) {
      *reinterpret_cast<__nv_bfloat162*>(dst + nd * 8) =
          __floats2bfloat162_rn(dq[nd][2 * r] * scale, dq[nd][2 * r + 1] * scale);
    }
  }
}

// ---- SIMT kernels ----------------------------------------------------------------------------------
// 32-row tiles; thread tid owns row tid/4 and columns sub, sub+4, ... (sub = tid%4) of its row; the
// four threads of a row are a quad of one warp. HSMAX (32, 64, 128) bounds the runtime head size hs.

constexpr int kSimtTile = 32;
constexpr int kSimtCols = kSimtTile / 4;  // score columns per thread

// Floats of dynamic shared memory: tiles [32][hs+1] fp32, plus [32][33] score tiles.
size_t SimtForwardSmem(int hs) { return (3 * kSimtTile * size_t(hs + 1) + kSimtTile * (kSimtTile + 1)) * 4; }
size_t SimtBackwardKVSmem(int hs) {
  return (4 * kSimtTile * size_t(hs + 1) + 2 * kSimtTile + 2 * kSimtTile * (kSimtTile + 1)) * 4;
}
size_t SimtBackwardQSmem(int hs) { return (4 * kSimtTile * size_t(hs + 1) + kSimtTile * (kSimtTile + 1)) * 4; }

// tile[r][d] = src[r * ld + d] for r < 32, d < hs (0 for rows >= valid); row stride hs + 1.
template <typename E>
__device__ __forceinline__ void LoadTileF32(float* tile, const E* src, long ld, int valid, int hs) {
  const int st = hs + 1;
  for (int i = threadIdx.x; i < kSimtTile * hs; i += kThreads) {
    const int r = i / hs, d = i % hs;
    tile[r * st + d] = r < valid ? ToFloat(src[r * ld + d]) : 0.0f;
  }
}

// grid (B*NH, ceil(T/32)), longest tiles first; dynamic smem SimtForwardSmem(hs).
template <typename E, int HSMAX>
__global__ void __launch_bounds__(kThreads) FlashForwardSimtKernel(E* out, float* lse, const E* qkv, int T, int NH,
                                                                   int hs, float scale_log2) {
  extern __shared__ float smem_f[];
  const int st = hs + 1;
  float* Qs = smem_f;
  float* Ks = Qs + kSimtTile * st;
  float* Vs = Ks + kSimtTile * st;
  float* Ps = Vs + kSimtTile * st;  // [32][33]

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * kSimtTile;
  const int C = NH * hs;
  const long ld = 3L * C;
  const E* base = qkv + long(b) * T * ld + h * hs;
  const int r = threadIdx.x / 4, sub = threadIdx.x % 4;
  const int row = q0 + r;

  LoadTileF32(Qs, base + q0 * ld, ld, T - q0, hs);
  float o[HSMAX / 4];
#pragma unroll
  for (int i = 0; i < HSMAX / 4; ++i) o[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const float* q = Qs + r * st;

  for (int j = 0; j <= qt; ++j) {
    const int k0 = j * kSimtTile;
    __syncthreads();  // the previous tile's readers are done (and Q is written before the first use)
    LoadTileF32(Ks, base + C + k0 * ld, ld, T - k0, hs);
    LoadTileF32(Vs, base + 2 * C + k0 * ld, ld, T - k0, hs);
    __syncthreads();
    float x[kSimtCols];
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) x[c] = 0.0f;
    for (int d = 0; d < hs; ++d) {
      const float qd = q[d];
#pragma unroll
      for (int c = 0; c < kSimtCols; ++c) x[c] += qd * Ks[(sub + 4 * c) * st + d];
    }
    float mx = m;
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) {
      x[c] = (k0 + sub + 4 * c > row) ? -INFINITY : x[c] * scale_log2;
      mx = fmaxf(mx, x[c]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mu = mx == -INFINITY ? 0.0f : mx;
    const float alpha = exp2f(m - mu);
    m = mx;
    float rs = 0.0f;
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) {
      const float p = exp2f(x[c] - mu);
      rs += p;
      Ps[r * (kSimtTile + 1) + sub + 4 * c] = p;
    }
    rs += __shfl_xor_sync(0xffffffffu, rs, 1);
    rs += __shfl_xor_sync(0xffffffffu, rs, 2);
    l = l * alpha + rs;
    __syncwarp();
#pragma unroll
    for (int i = 0; i < HSMAX / 4; ++i) o[i] *= alpha;
#pragma unroll 4  // (full unrolling made ptxas spill at HSMAX 64 on sm_90)
    for (int kk = 0; kk < kSimtTile; ++kk) {
      const float p = Ps[r * (kSimtTile + 1) + kk];
      const float* v = Vs + kk * st;
#pragma unroll
      for (int i = 0; i < HSMAX / 4; ++i) {
        if (sub + 4 * i < hs) o[i] += p * v[sub + 4 * i];
      }
    }
  }
  if (row < T) {
    const float inv = 1.0f / l;
    E* dst = out + (long(b) * T + row) * C + h * hs;
#pragma unroll
    for (int i = 0; i < HSMAX / 4; ++i) {
      if (sub + 4 * i < hs) dst[sub + 4 * i] = FromFloat<E>(o[i] * inv);
    }
    if (sub == 0) lse[long(bh) * T + row] = (m + log2f(l)) * kLn2;
  }
}

// dK, dV: grid (B*NH, ceil(T/32)), key tile = blockIdx.y; thread owns key row k0 + tid/4.
template <typename E, int HSMAX>
__global__ void __launch_bounds__(kThreads) FlashBackwardKVSimtKernel(E* dqkv, const E* dout, const E* qkv,
                                                                      const float* lse, const float* dsum, int T,
                                                                      int NH, int hs, float scale,
                                                                      float scale_log2) {
  extern __shared__ float smem_f[];
  const int st = hs + 1;
  float* Ks = smem_f;
  float* Vs = Ks + kSimtTile * st;
  float* Qs = Vs + kSimtTile * st;
  float* dOs = Qs + kSimtTile * st;
  float* Ls = dOs + kSimtTile * st;  // [32]
  float* Ds = Ls + kSimtTile;        // [32]
  float* Ps = Ds + kSimtTile;        // [32][33]: P^T (rows = keys)
  float* dSs = Ps + kSimtTile * (kSimtTile + 1);

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int kt = blockIdx.y, k0 = kt * kSimtTile;
  const int C = NH * hs;
  const long ld = 3L * C;
  const E* base = qkv + long(b) * T * ld + h * hs;
  const E* obase = dout + long(b) * T * C + h * hs;
  const int r = threadIdx.x / 4, sub = threadIdx.x % 4;
  const int key = k0 + r;
  const int n_qt = (T + kSimtTile - 1) / kSimtTile;

  LoadTileF32(Ks, base + C + k0 * ld, ld, T - k0, hs);
  LoadTileF32(Vs, base + 2 * C + k0 * ld, ld, T - k0, hs);
  float dk[HSMAX / 4], dv[HSMAX / 4];
#pragma unroll
  for (int i = 0; i < HSMAX / 4; ++i) dk[i] = dv[i] = 0.0f;
  const float* kr = Ks + r * st;
  const float* vr = Vs + r * st;

  for (int i = kt; i < n_qt; ++i) {  // query tiles before the key tile see none of its keys
    const int q0 = i * kSimtTile;
    __syncthreads();
    LoadTileF32(Qs, base + q0 * ld, ld, T - q0, hs);
    LoadTileF32(dOs, obase + long(q0) * C, C, T - q0, hs);
    for (int t = threadIdx.x; t < kSimtTile; t += kThreads) {
      const bool ok = q0 + t < T;
      Ls[t] = ok ? lse[long(bh) * T + q0 + t] : 0.0f;
      Ds[t] = ok ? dsum[long(bh) * T + q0 + t] : 0.0f;
    }
    __syncthreads();
    float s[kSimtCols], dp[kSimtCols];
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) s[c] = dp[c] = 0.0f;
    for (int d = 0; d < hs; ++d) {
      const float kd = kr[d], vd = vr[d];
#pragma unroll
      for (int c = 0; c < kSimtCols; ++c) {
        s[c] += Qs[(sub + 4 * c) * st + d] * kd;
        dp[c] += dOs[(sub + 4 * c) * st + d] * vd;
      }
    }
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) {
      const int ql = sub + 4 * c, query = q0 + ql;
      const float p = (query >= key && query < T) ? exp2f(s[c] * scale_log2 - Ls[ql] * kLog2e) : 0.0f;
      Ps[r * (kSimtTile + 1) + ql] = p;
      dSs[r * (kSimtTile + 1) + ql] = p * (dp[c] - Ds[ql]);
    }
    __syncwarp();
    for (int ql = 0; ql < kSimtTile; ++ql) {
      const float p = Ps[r * (kSimtTile + 1) + ql], ds = dSs[r * (kSimtTile + 1) + ql];
      const float* qrow = Qs + ql * st;
      const float* orow = dOs + ql * st;
#pragma unroll
      for (int c = 0; c < HSMAX / 4; ++c) {
        const int d = sub + 4 * c;
        if (d < hs) {
          dv[c] += p * orow[d];
          dk[c] += ds * qrow[d];
        }
      }
    }
  }
  if (key < T) {
    E* dst = dqkv + (long(b) * T + key) * ld + C + h * hs;
#pragma unroll
    for (int c = 0; c < HSMAX / 4; ++c) {
      const int d = sub + 4 * c;
      if (d < hs) {
        dst[d] = FromFloat<E>(dk[c] * scale);
        dst[C + d] = FromFloat<E>(dv[c]);
      }
    }
  }
}

// dQ: grid (B*NH, ceil(T/32)), longest tiles first; thread owns query row q0 + tid/4.
template <typename E, int HSMAX>
__global__ void __launch_bounds__(kThreads) FlashBackwardQSimtKernel(E* dqkv, const E* dout, const E* qkv,
                                                                     const float* lse, const float* dsum, int T,
                                                                     int NH, int hs, float scale, float scale_log2) {
  extern __shared__ float smem_f[];
  const int st = hs + 1;
  float* Qs = smem_f;
  float* dOs = Qs + kSimtTile * st;
  float* Ks = dOs + kSimtTile * st;
  float* Vs = Ks + kSimtTile * st;
  float* dSs = Vs + kSimtTile * st;  // [32][33]

  const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
  const int qt = gridDim.y - 1 - blockIdx.y;
  const int q0 = qt * kSimtTile;
  const int C = NH * hs;
  const long ld = 3L * C;
  const E* base = qkv + long(b) * T * ld + h * hs;
  const int r = threadIdx.x / 4, sub = threadIdx.x % 4;
  const int row = q0 + r;

  LoadTileF32(Qs, base + q0 * ld, ld, T - q0, hs);
  LoadTileF32(dOs, dout + (long(b) * T + q0) * C + h * hs, C, T - q0, hs);
  const float lse2 = row < T ? lse[long(bh) * T + row] * kLog2e : 0.0f;
  const float drow = row < T ? dsum[long(bh) * T + row] : 0.0f;
  float dq[HSMAX / 4];
#pragma unroll
  for (int i = 0; i < HSMAX / 4; ++i) dq[i] = 0.0f;
  const float* qr = Qs + r * st;
  const float* orow = dOs + r * st;

  for (int j = 0; j <= qt; ++j) {
    const int k0 = j * kSimtTile;
    __syncthreads();
    LoadTileF32(Ks, base + C + k0 * ld, ld, T - k0, hs);
    LoadTileF32(Vs, base + 2 * C + k0 * ld, ld, T - k0, hs);
    __syncthreads();
    float s[kSimtCols], dp[kSimtCols];
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) s[c] = dp[c] = 0.0f;
    for (int d = 0; d < hs; ++d) {
      const float qd = qr[d], od = orow[d];
#pragma unroll
      for (int c = 0; c < kSimtCols; ++c) {
        s[c] += qd * Ks[(sub + 4 * c) * st + d];
        dp[c] += od * Vs[(sub + 4 * c) * st + d];
      }
    }
#pragma unroll
    for (int c = 0; c < kSimtCols; ++c) {
      const int kl = sub + 4 * c;
      const float p = (k0 + kl <= row) ? exp2f(s[c] * scale_log2 - lse2) : 0.0f;
      dSs[r * (kSimtTile + 1) + kl] = p * (dp[c] - drow);
    }
    __syncwarp();
    for (int kl = 0; kl < kSimtTile; ++kl) {
      const float ds = dSs[r * (kSimtTile + 1) + kl];
      const float* krow = Ks + kl * st;
#pragma unroll
      for (int c = 0; c < HSMAX / 4; ++c) {
        if (sub + 4 * c < hs) dq[c] += ds * krow[sub + 4 * c];
      }
    }
  }
  if (row < T) {
    E* dst = dqkv + (long(b) * T + row) * ld + h * hs;
#pragma unroll
    for (int c = 0; c < HSMAX / 4; ++c) {
      if (sub + 4 * c < hs) dst[sub + 4 * c] = FromFloat<E>(dq[c] * scale);
    }
  }
}

// D[b,h,t] = sum_d dout[b,t,h*hs+d] * out[b,t,h*hs+d], (B,NH,T) fp32. One warp per (b,t,h), warps
// ordered (b,t,h) so that neighbouring warps read neighbouring heads. 256 threads per block.
template <typename E>
__global__ void RowDotKernel(float* dsum, const E* dout, const E* out, long rows, int T, int NH, int hs) {
  const long w = blockIdx.x * 8L + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (w >= rows) return;
  const long bt = w / NH;  // b * T + t
  const int h = static_cast<int>(w % NH);
  const long off = bt * NH * hs + long(h) * hs;
  float acc = 0.0f;
  for (int d = lane; d < hs; d += 32) acc += ToFloat(dout[off + d]) * ToFloat(out[off + d]);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) {
    const long b = bt / T, t = bt % T;
    dsum[(b * NH + h) * T + t] = acc;
  }
}

// ---- Launchers -------------------------------------------------------------------------------------

// Kernels needing more than 48 KB of dynamic shared memory must opt in; the attribute is set to the
// instantiation's maximum (a constant per kernel), so concurrent callers never race on it.
template <typename Kernel>
Status AllowSmem(Kernel* kernel, size_t max_bytes, const char* name) {
  if (max_bytes <= kDefaultSmem) return Status::OK();
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(max_bytes));
  if (err != cudaSuccess) return CudaError(err, name, __FILE__, __LINE__);
  return Status::OK();
}

dim3 Grid(int B, int NH, int T, int tile) { return dim3(unsigned(B * NH), CeilDiv(T, tile)); }

template <int HS>
Status LaunchForwardMma(void* out, float* lse, const void* qkv, int B, int T, int NH, float scale_log2,
                        cudaStream_t stream) {
  constexpr size_t smem = ForwardMmaSmem<HS>();
  TF_RETURN_IF_ERROR(AllowSmem(FlashForwardMmaKernel<HS>, smem, "FlashForwardMmaKernel"));
  FlashForwardMmaKernel<HS><<<Grid(B, NH, T, kMmaTile), kThreads, smem, stream>>>(
      static_cast<bf16*>(out), lse, static_cast<const bf16*>(qkv), T, NH, scale_log2);
  return TF_CHECK_LAUNCH("FlashForwardMmaKernel");
}

template <int HS>
Status LaunchBackwardMma(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* dsum, int B,
                         int T, int NH, float scale, float scale_log2, cudaStream_t stream) {
  constexpr size_t kv_smem = BackwardKVMmaSmem<HS>(), q_smem = BackwardQMmaSmem<HS>();
  TF_RETURN_IF_ERROR(AllowSmem(FlashBackwardKVMmaKernel<HS>, kv_smem, "FlashBackwardKVMmaKernel"));
  TF_RETURN_IF_ERROR(AllowSmem(FlashBackwardQMmaKernel<HS>, q_smem, "FlashBackwardQMmaKernel"));
  auto* g = static_cast<bf16*>(dqkv);
  auto* go = static_cast<const bf16*>(dout);
  auto* x = static_cast<const bf16*>(qkv);
  FlashBackwardKVMmaKernel<HS><<<Grid(B, NH, T, kMmaTile), kThreads, kv_smem, stream>>>(g, go, x, lse, dsum, T, NH,
                                                                                         scale, scale_log2);
  TF_RETURN_IF_ERROR(TF_CHECK_LAUNCH("FlashBackwardKVMmaKernel"));
  FlashBackwardQMmaKernel<HS><<<Grid(B, NH, T, kMmaTile), kThreads, q_smem, stream>>>(g, go, x, lse, dsum, T, NH,
                                                                                       scale, scale_log2);
  return TF_CHECK_LAUNCH("FlashBackwardQMmaKernel");
}

// Calls f.template operator()<HSMAX>() with the smallest of 32, 64, 128 that holds hs.
template <typename F>
Status DispatchHeadBound(int hs, F&& f) {
  if (hs <= 32) return f.template operator()<32>();
  if (hs <= 64) return f.template operator()<64>();
  return f.template operator()<128>();
}

Status LaunchForwardSimt(void* out, float* lse, const void* qkv, int B, int T, int NH, int hs, float scale_log2,
                         DType dt, cudaStream_t stream) {
  return DispatchDType(dt, [&]<typename E>() {
    return DispatchHeadBound(hs, [&]<int HSMAX>() -> Status {
      auto* kernel = FlashForwardSimtKernel<E, HSMAX>;
      TF_RETURN_IF_ERROR(AllowSmem(kernel, SimtForwardSmem(HSMAX), "FlashForwardSimtKernel"));
      kernel<<<Grid(B, NH, T, kSimtTile), kThreads, SimtForwardSmem(hs), stream>>>(
          static_cast<E*>(out), lse, static_cast<const E*>(qkv), T, NH, hs, scale_log2);
      return TF_CHECK_LAUNCH("FlashForwardSimtKernel");
    });
  });
}

Status LaunchBackwardSimt(void* dqkv, const void* dout, const void* qkv, const float* lse, const float* dsum, int B,
                          int T, int NH, int hs, float scale, float scale_log2, DType dt, cudaStream_t stream) {
  return DispatchDType(dt, [&]<typename E>() {
    return DispatchHeadBound(hs, [&]<int HSMAX>() -> Status {
      auto* kv = FlashBackwardKVSimtKernel<E, HSMAX>;
      auto* q = FlashBackwardQSimtKernel<E, HSMAX>;
      TF_RETURN_IF_ERROR(AllowSmem(kv, SimtBackwardKVSmem(HSMAX), "FlashBackwardKVSimtKernel"));
      TF_RETURN_IF_ERROR(AllowSmem(q, SimtBackwardQSmem(HSMAX), "FlashBackwardQSimtKernel"));
      auto* g = static_cast<E*>(dqkv);
      auto* go = static_cast<const E*>(dout);
      auto* x = static_cast<const E*>(qkv);
      kv<<<Grid(B, NH, T, kSimtTile), kThreads, SimtBackwardKVSmem(hs), stream>>>(g, go, x, lse, dsum, T, NH, hs,
                                                                                  scale, scale_log2);
      TF_RETURN_IF_ERROR(TF_CHECK_LAUNCH("FlashBackwardKVSimtKernel"));
      q<<<Grid(B, NH, T, kSimtTile), kThreads, SimtBackwardQSmem(hs), stream>>>(g, go, x, lse, dsum, T, NH, hs, scale,
                                                                                scale_log2);
      return TF_CHECK_LAUNCH("FlashBackwardQSimtKernel");
    });
  });
}

Status LaunchRowDot(float* dsum, const void* dout, const void* out, int B, int T, int NH, int hs, DType dt,
                    cudaStream_t stream) {
  const long rows = long(B) * T * NH;
  return DispatchDType(dt, [&]<typename E>() {
    RowDotKernel<E><<<CeilDiv(rows, 8), 256, 0, stream>>>(dsum, static_cast<const E*>(dout),
                                                           static_cast<const E*>(out), rows, T, NH, hs);
    return TF_CHECK_LAUNCH("RowDotKernel");
  });
}

// ---- Argument checks -------------------------------------------------------------------------------

bool UsesMma(int hs, DType dt, FlashImpl impl) {
  return impl == FlashImpl::kAuto && dt == DType::kBF16 && (hs == 64 || hs == 128);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

Status CheckShape(const char* op, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || C % NH != 0) {
    return InvalidArgument(std::string(op) + ": bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
                           " C=" + std::to_string(C) + " NH=" + std::to_string(NH) +
                           " (need positive sizes and C % NH == 0)");
  }
  const int hs = C / NH;
  if (hs > 128) {
    return InvalidArgument(std::string(op) + ": head size " + std::to_string(hs) +
                           " unsupported (the flash kernels hold a head row in registers: hs <= 128)");
  }
  if (long(B) * NH > 0x7fffffffL || CeilDiv(T, kSimtTile) > 65535u) {
    return InvalidArgument(std::string(op) + ": B*NH or T too large for the launch grid");
  }
  if (long(B) * T * 3 * C > (long(1) << 40)) return InvalidArgument(std::string(op) + ": tensor too large");
  return Status::OK();
}

}  // namespace

size_t flash_attention_backward_scratch_bytes(int B, int T, int NH) {
  if (B <= 0 || T <= 0 || NH <= 0) return 0;
  const size_t bytes = size_t(B) * NH * T * sizeof(float);
  return (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
}

bool flash_attention_uses_tensor_cores(int C, int NH, DType dt, FlashImpl impl) {
  return C > 0 && NH > 0 && C % NH == 0 && UsesMma(C / NH, dt, impl);
}

Status flash_attention_forward(void* out, float* lse, const void* qkv, int B, int T, int C, int NH, DType dt,
                               cudaStream_t stream, FlashImpl impl) {
  TF_RETURN_IF_ERROR(CheckShape("flash_attention_forward", B, T, C, NH));
  if (out == nullptr || lse == nullptr || qkv == nullptr) {
    return InvalidArgument("flash_attention_forward: out, lse and qkv must not be null");
  }
  const int hs = C / NH;
  const float scale_log2 = kLog2e / std::sqrt(static_cast<float>(hs));
  if (UsesMma(hs, dt, impl)) {
    if (!Aligned16(out) || !Aligned16(qkv)) {
      return InvalidArgument("flash_attention_forward: out and qkv must be 16-byte aligned (tensor-core path)");
    }
    return hs == 64 ? LaunchForwardMma<64>(out, lse, qkv, B, T, NH, scale_log2, stream)
                    : LaunchForwardMma<128>(out, lse, qkv, B, T, NH, scale_log2, stream);
  }
  return LaunchForwardSimt(out, lse, qkv, B, T, NH, hs, scale_log2, dt, stream);
}

Status flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* lse,
                                int B, int T, int C, int NH, DType dt, void* scratch, size_t scratch_bytes,
                                cudaStream_t stream, FlashImpl impl) {
  TF_RETURN_IF_ERROR(CheckShape("flash_attention_backward", B, T, C, NH));
  if (dqkv == nullptr || dout == nullptr || qkv == nullptr || out == nullptr || lse == nullptr ||
      scratch == nullptr) {
    return InvalidArgument("flash_attention_backward: dqkv, dout, qkv, out, lse and scratch must not be null");
  }
  if (scratch_bytes < flash_attention_backward_scratch_bytes(B, T, NH)) {
    return InvalidArgument("flash_attention_backward: scratch holds " + std::to_string(scratch_bytes) +
                           " bytes, needs " + std::to_string(flash_attention_backward_scratch_bytes(B, T, NH)));
  }
  if (reinterpret_cast<uintptr_t>(scratch) % 16 != 0) {
    return InvalidArgument("flash_attention_backward: scratch must be 16-byte aligned");
  }
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const float scale_log2 = kLog2e * scale;
  const bool mma = UsesMma(hs, dt, impl);
  if (mma && (!Aligned16(dqkv) || !Aligned16(dout) || !Aligned16(qkv))) {
    return InvalidArgument("flash_attention_backward: dqkv, dout and qkv must be 16-byte aligned (tensor-core path)");
  }
  float* dsum = static_cast<float*>(scratch);
  TF_RETURN_IF_ERROR(LaunchRowDot(dsum, dout, out, B, T, NH, hs, dt, stream));
  if (mma) {
    return hs == 64 ? LaunchBackwardMma<64>(dqkv, dout, qkv, lse, dsum, B, T, NH, scale, scale_log2, stream)
                    : LaunchBackwardMma<128>(dqkv, dout, qkv, lse, dsum, B, T, NH, scale, scale_log2, stream);
  }
  return LaunchBackwardSimt(dqkv, dout, qkv, lse, dsum, B, T, NH, hs, scale, scale_log2, dt, stream);
}

}  // namespace tf::cuda
