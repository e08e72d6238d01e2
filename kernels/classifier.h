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
