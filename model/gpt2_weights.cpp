#include "model/gpt2_weights.h"

#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"

namespace tf {
namespace {

bool IsConv1D(const std::string& name) {
  return name.ends_with("attn.c_attn.weight") || name.ends_with("attn.c_proj.weight") ||
         name.ends_with("mlp.c_fc.weight") || name.ends_with("mlp.c_proj.weight");
}

// The shape the tensor has in a Hugging Face file.
std::vector<int64_t> FileShape(const ParamTensor& t, const GPT2Config& config) {
  if (t.name == "transformer.wte.weight") return {config.vocab_size, config.n_embd};
  if (IsConv1D(t.name)) return {t.shape[1], t.shape[0]};
  return t.shape;
}

std::string ShapeString(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

bool IsIgnoredBuffer(const std::string& name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias");
}

}  // namespace

Status ImportHFWeights(const std::string& path, const GPT2Config& config, std::span<float> params, Env* env) {
  TF_ASSIGN_OR_RETURN(SafetensorsContents file, ReadSafetensors(path, env));
  return LoadHFTensors(file.tensors, config, params, path);
}

Status LoadHFTensors(const std::vector<NamedTensor>& tensors, const GPT2Config& config, std::span<float> params,
                     const std::string& path) {
  ParameterLayout layout(config);
  if (static_cast<int64_t>(params.size()) != layout.total()) {
    return Status::Internal("LoadHFTensors: buffer has {} floats, layout needs {}", params.size(), layout.total());
  }
  std::map<std::string, const NamedTensor*> by_name;
  const NamedTensor* lm_head = nullptr;
  for (const NamedTensor& t : tensors) {
    if (IsIgnoredBuffer(t.name)) continue;
    if (t.name == "lm_head.weight") {
      lm_head = &t;  // checked against wte below: TrainFlow's GPT-2 ties them
      continue;
    }
    std::string key = t.name.starts_with("transformer.") ? t.name : "transformer." + t.name;
    if (layout.Find(key) == nullptr) {
      return Status::InvalidArgument("{}: unexpected tensor '{}' (not a GPT-2 parameter of this config: n_layer={})",
                                     path, t.name, config.n_layer);
    }
    if (!by_name.emplace(key, &t).second) {
      return Status::InvalidArgument("{}: tensor '{}' appears twice (with and without the 'transformer.' prefix)",
                                     path, key);
    }
  }
  std::fill(params.begin(), params.end(), 0.0f);
  for (const ParamTensor& t : layout.tensors()) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return Status::InvalidArgument("{}: missing tensor '{}' (model config: n_layer={}, n_embd={})", path, t.name,
                                     config.n_layer, config.n_embd);
    }
    const NamedTensor& src = *it->second;

    const std::vector<int64_t> want = FileShape(t, config);
    if (src.shape != want) {
      return Status::InvalidArgument("{}: tensor '{}' has shape {}, the model config needs {}", path, src.name,
                                     ShapeString(src.shape), ShapeString(want));
    }
    int64_t want_numel = 1;
    for (int64_t d : want) want_numel *= d;
    if (static_cast<int64_t>(src.data.size()) != want_numel) {
      return Status::InvalidArgument("{}: tensor '{}' holds {} values, its shape needs {}", path, src.name,
                                     src.data.size(), want_numel);
    }
    for (size_t i = 0; i < src.data.size(); ++i) {
      if (!std::isfinite(src.data[i])) {
        return Status::InvalidArgument("{}: tensor '{}' holds {} at element {}: the weights are damaged", path,
                                       src.name, src.data[i], i);
      }
    }
    if (t.name == "transformer.wte.weight" && lm_head != nullptr) {
      if (lm_head->shape != src.shape) {
        return Status::InvalidArgument("{}: lm_head.weight has shape {}, but the tied LM head must equal wte {}", path,
                                       ShapeString(lm_head->shape), ShapeString(src.shape));
      }
      if (lm_head->data != src.data) {
        return Status::InvalidArgument("{}: lm_head.weight differs from transformer.wte.weight; TrainFlow's GPT-2 ties "
                                       "them, so an untied LM head cannot be loaded",
                                       path);
      }
    }
    float* dst = params.data() + t.offset;
    if (IsConv1D(t.name)) {
      const int64_t in = want[0], out = want[1];  // file (in, out) -> memory (out, in)
      for (int64_t i = 0; i < in; ++i)
        for (int64_t o = 0; o < out; ++o) dst[o * in + i] = src.data[static_cast<size_t>(i * out + o)];
    } else {
      std::copy(src.data.begin(), src.data.end(), dst);
    }
  }
  return Status::OK();
}

std::vector<NamedTensor> ToHFTensors(const GPT2Config& config, std::span<const float> params) {
  ParameterLayout layout(config);
  std::vector<NamedTensor> out;
  for (const ParamTensor& t : layout.tensors()) {
    const float* src = params.data() + t.offset;
    NamedTensor nt{t.name, FileShape(t, config), {}};
    if (IsConv1D(t.name)) {
      const int64_t in = nt.shape[0], outc = nt.shape[1];
      nt.data.resize(static_cast<size_t>(in * outc));
      for (int64_t o = 0; o < outc; ++o)
        for (int64_t i = 0; i < in; ++i) nt.data[static_cast<size_t>(i * outc + o)] = src[o * in + i];
    } else {
      int64_t n = 1;
      for (int64_t d : nt.shape) n *= d;
      nt.data.assign(src, src + n);
    }
    out.push_back(std::move(nt));
  }
  return out;
}

Status ExportHFWeights(const std::string& path, const GPT2Config& config, std::span<const float> params,
                       std::map<std::string, std::string> metadata, SafetensorsDtype dtype, Env* env) {
  ParameterLayout layout(config);
  if (static_cast<int64_t>(params.size()) != layout.total()) {
    return Status::Internal("ExportHFWeights: buffer has {} floats, layout needs {}", params.size(), layout.total());
  }
  std::vector<NamedTensor> transposed;  // owned copies of the Conv1D weights
  transposed.reserve(static_cast<size_t>(4 * config.n_layer));
  std::vector<TensorView> views;
  for (const ParamTensor& t : layout.tensors()) {
    const float* src = params.data() + t.offset;
    std::vector<int64_t> shape = FileShape(t, config);
    if (IsConv1D(t.name)) {
      const int64_t in = shape[0], out = shape[1];
      NamedTensor nt{t.name, shape, std::vector<float>(static_cast<size_t>(in * out))};
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) nt.data[static_cast<size_t>(i * out + o)] = src[o * in + i];
      transposed.push_back(std::move(nt));
      views.push_back(TensorView{t.name, shape, transposed.back().data.data()});
    } else {
      views.push_back(TensorView{t.name, shape, src});  // wte: the first vocab_size rows
    }
  }
  metadata.emplace("format", "pt");
  return WriteSafetensors(path, views, metadata, dtype, env);
}

std::string HFConfigJson(const GPT2Config& c, const std::string& tokenizer, SafetensorsDtype dtype) {
  const bool gpt2 = tokenizer == "gpt2" || (tokenizer.empty() && c.vocab_size == 50257);
  const nlohmann::json eot = gpt2 ? nlohmann::json(50256) : nlohmann::json(nullptr);
  const char* torch_dtype = dtype == SafetensorsDtype::kF16    ? "float16"
                            : dtype == SafetensorsDtype::kBF16 ? "bfloat16"
                                                               : "float32";
  nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                      {"model_type", "gpt2"},
                      {"activation_function", "gelu_new"},
                      {"n_layer", c.n_layer},
                      {"n_head", c.n_head},
                      {"n_embd", c.n_embd},
                      {"vocab_size", c.vocab_size},
                      {"n_positions", c.block_size},
                      {"n_ctx", c.block_size},
                      {"n_inner", nullptr},
                      {"layer_norm_epsilon", 1e-5},
                      {"initializer_range", 0.02},
                      {"resid_pdrop", 0.0},
                      {"embd_pdrop", 0.0},
                      {"attn_pdrop", 0.0},
                      {"tie_word_embeddings", true},
                      {"scale_attn_weights", true},
                      {"bos_token_id", eot},
                      {"eos_token_id", eot},
                      {"torch_dtype", torch_dtype}};
  return j.dump(2) + "\n";
}

}  // namespace tf
