// Fused softmax + cross-entropy (+ gradient) over the vocabulary, CPU implementation.
#pragma once
#include <cstdint>

namespace tf::cpu {
// logits (N,Vp), of which the first V columns are real tokens (Vp >= V is the padded vocab).
// losses[i] = -log softmax(logits[i, :V])[targets[i]]. If dloss != 0, logits is overwritten
// in place with d(loss_i * dloss)/dlogits = (softmax - onehot) * dloss, padded columns 0.
// targets[i] < V (validated by the caller).
void crossentropy_forward_backward(float* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                   float dloss);
// Row-wise softmax probabilities of logits[:, :V] for sampling: probs (N,V).
void softmax_rows(float* probs, const float* logits, int N, int V, int Vp, float temperature);
}  // namespace tf::cpu

#if defined(TF_WITH_CUDA)
#include "kernels/cuda_runtime.h"
namespace tf::cuda {
// Device version of crossentropy_forward_backward (kernels/classifier.cu) on `stream`, same contract:
// logits (N,Vp) device memory of element type `dt`, overwritten in place with the gradient (padded
// columns 0) when dloss != 0 and untouched when dloss == 0; losses (N) fp32; targets (N) int32.
// One block per row, online max/sum in fp32; probabilities are never stored separately.
// REQUIRES: 0 <= targets[i] < V (device memory: not checked on the host; an out-of-range target
// gives a NaN loss and no one-hot term instead of an out-of-bounds read).
Status crossentropy_forward_backward(void* logits, float* losses, const int32_t* targets, int N, int V, int Vp,
                                     float dloss, DType dt, cudaStream_t stream);
// *acc_device += scale * sum(losses[0..N)) in double, by one block in a fixed order (deterministic):
// the loss of a micro-batch is accumulated on the device, so the trainer reads it once per step
// instead of synchronising after every micro-batch.
Status accumulate_loss(const float* losses, int N, double scale, double* acc_device, cudaStream_t stream);
}  // namespace tf::cuda
#endif
