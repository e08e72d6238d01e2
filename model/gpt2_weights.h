// Weight interop with Hugging Face GPT-2 checkpoints (safetensors). This file owns the key and
// layout mapping between TrainFlow's ParameterLayout and Hugging Face's names:
//  - names "transformer.<...>" (GPT2LMHeadModel) or "<...>" without the prefix (GPT2Model);
//  - Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are stored [in, out] by HF
//    and transposed to TrainFlow's (out, in);
//  - wte has vocab_size rows in the file and padded_vocab_size in memory (extra rows zero);
//  - non-parameter buffers (attn.bias, attn.masked_bias) and the tied lm_head.weight are ignored.
// Missing, extra, or mis-shaped tensors are errors naming the tensor and the file.
#pragma once
#include <map>
#include <span>
#include <string>

#include "base/status.h"
#include "model/config.h"
#include "model/parameters.h"
#include "model/safetensors.h"

namespace tf {

// Loads `path` into params (laid out by ParameterLayout(config)).
// REQUIRES: params.size() == ParameterLayout(config).total().
// Refuses non-finite values (naming the tensor) and an lm_head.weight that is not wte (tied).
Status ImportHFWeights(const std::string& path, const GPT2Config& config, std::span<float> params,
                       Env* env = Env::Default());

// Same, from tensors already in memory; `source` names their origin in errors.
Status LoadHFTensors(const std::vector<NamedTensor>& tensors, const GPT2Config& config, std::span<float> params,
                     const std::string& source);

// A copy of params as Hugging Face tensors (names with "transformer.", Conv1D layout, V rows of
// wte) — e.g. to compare gradients with a Hugging Face/PyTorch reference.
std::vector<NamedTensor> ToHFTensors(const GPT2Config& config, std::span<const float> params);

// Writes params as a Hugging Face GPT2LMHeadModel safetensors file (`dtype`, default F32, "transformer." names,
// Conv1D layout, vocab_size rows of wte). `metadata` is stored in __metadata__ (plus "format": "pt").
Status ExportHFWeights(const std::string& path, const GPT2Config& config, std::span<const float> params,
                       std::map<std::string, std::string> metadata = {},
                       SafetensorsDtype dtype = SafetensorsDtype::kF32, Env* env = Env::Default());

// Hugging Face's config.json for the model (GPT2LMHeadModel, gelu_new, eps 1e-5, tied embeddings).
// torch_dtype names `dtype`; bos/eos_token_id are GPT-2's <|endoftext|> (50256) for tokenizer
// "gpt2" and null for "byte" (it has no such token); tokenizer "" decides by the vocabulary
// (50257: gpt2, else none).
std::string HFConfigJson(const GPT2Config& config, const std::string& tokenizer = "",
                         SafetensorsDtype dtype = SafetensorsDtype::kF32);

}  // namespace tf
