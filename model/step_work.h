// The work of one GPT-2 training step on the GPU, piece by piece (the ranges GPT2Cuda marks for the
// profiler: "qkv fwd", "attention bwd", "adamw", ...), for a roofline view of a profile: each piece's
// matrix FLOPs and the bytes it must move as the step is structured (every input of a kernel read
// once, every output written once, read-modify-writes twice; re-reads from cache not counted).
// With a peak FLOP rate and a memory bandwidth, max(flops / peak, bytes / bandwidth) is the least
// time the piece can take; measured time over that says how far each piece is from its ceiling,
// and the sum says what MFU the step's current structure could reach at best.
//
// What counts: GEMM and attention products at 2 FLOPs per multiply-add (causal attention: only the
// T(T+1)/2 scores per head that are needed; its backward as the 5 products of FlashAttention-2,
// whatever the kernel does); element-wise arithmetic is not counted (those pieces are
// bandwidth-bound). Host-to-device copies ("tokens to device") are not device-memory work: 0 bytes.
// The GEMM attention (kGemm) is counted as it runs: full T x T products and the probabilities stored
// and re-read. Host code only (no CUDA needed): built and tested everywhere.
#pragma once
#include <string>
#include <vector>

#include "model/config.h"

namespace tf {

struct StepWorkOptions {
  int batch = 1, seq = 1;
  int elem_bytes = 2;           // storage dtype: 2 (bf16) or 4 (fp32)
  bool gemm_attention = false;  // GPT2CudaOptions::Attention::kGemm (else flash / cuDNN)
  int recompute = 0;            // GPT2CudaOptions::recompute
  int gelu_fusion = 0;          // resolved GPT2CudaOptions::GeluFusion
  bool fuse_residual = true;    // GPT2CudaOptions::fuse_residual
};

struct PieceWork {
  std::string name;  // GPT2Cuda's range name
  double flops = 0;  // matrix FLOPs per step
  double bytes = 0;  // device-memory bytes per step
};

// One training step (ZeroGrad, ForwardBackward, Step) in the order the pieces first occur; each
// name once, summed over its calls.
std::vector<PieceWork> GPT2StepWork(const GPT2Config& config, const StepWorkOptions& options);

// The least time of `work` in ms: max(flops / peak_flops, bytes / bandwidth); peaks in FLOP/s and
// bytes/s (> 0).
double RooflineMs(const PieceWork& work, double peak_flops, double bandwidth);

}  // namespace tf
