#include "model/parameters.h"

#include <fmt/format.h>

namespace tf {

ParameterLayout::ParameterLayout(const GPT2Config& config) {
  const int64_t C = config.n_embd;
  auto add = [&](std::string name, std::vector<int64_t> shape, int layer) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    const bool decay = shape.size() >= 2;
    tensors_.push_back(ParamTensor{std::move(name), std::move(shape), total_, n, decay, layer});
    total_ += n;
  };
  add("transformer.wte.weight", {config.padded_vocab_size, C}, -1);
  add("transformer.wpe.weight", {config.block_size, C}, -1);
  for (int l = 0; l < config.n_layer; ++l) {
    layer_begin_.push_back(total_);
    const std::string p = fmt::format("transformer.h.{}.", l);
    add(p + "ln_1.weight", {C}, l);
    add(p + "ln_1.bias", {C}, l);
    add(p + "attn.c_attn.weight", {3 * C, C}, l);
    add(p + "attn.c_attn.bias", {3 * C}, l);
    add(p + "attn.c_proj.weight", {C, C}, l);
    add(p + "attn.c_proj.bias", {C}, l);
    add(p + "ln_2.weight", {C}, l);
    add(p + "ln_2.bias", {C}, l);
    add(p + "mlp.c_fc.weight", {4 * C, C}, l);
    add(p + "mlp.c_fc.bias", {4 * C}, l);
    add(p + "mlp.c_proj.weight", {C, 4 * C}, l);
    add(p + "mlp.c_proj.bias", {C}, l);
  }
  layer_begin_.push_back(total_);
  add("transformer.ln_f.weight", {C}, -1);
  add("transformer.ln_f.bias", {C}, -1);
}

const ParamTensor* ParameterLayout::Find(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

ModelView MakeModelView(const ParameterLayout& layout, float* base) {
  const auto& t = layout.tensors();
  ModelView v;
  v.wte = base + t[0].offset;
  v.wpe = base + t[1].offset;
  const size_t n_layer = (t.size() - 4) / 12;
  for (size_t l = 0; l < n_layer; ++l) {
    const ParamTensor* p = &t[2 + 12 * l];
    v.blocks.push_back(BlockView{base + p[0].offset, base + p[1].offset, base + p[2].offset, base + p[3].offset,
                                 base + p[4].offset, base + p[5].offset, base + p[6].offset, base + p[7].offset,
                                 base + p[8].offset, base + p[9].offset, base + p[10].offset,
                                 base + p[11].offset});
  }
  v.lnf_w = base + t[t.size() - 2].offset;
  v.lnf_b = base + t[t.size() - 1].offset;
  return v;
}

std::vector<std::pair<int64_t, int64_t>> GradReadyRanges(const ParameterLayout& layout) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int L = layout.n_layer();
  out.emplace_back(layout.tensors()[layout.tensors().size() - 2].offset, layout.total());
  for (int l = L - 1; l >= 0; --l) out.emplace_back(layout.LayerBegin(l), layout.LayerEnd(l));
  out.emplace_back(0, L > 0 ? layout.LayerBegin(0) : layout.tensors()[layout.tensors().size() - 2].offset);
  return out;
}

std::vector<DecayRange> DecayRanges(const ParameterLayout& layout) {
  std::vector<DecayRange> ranges;
  for (const ParamTensor& t : layout.tensors()) {
    if (!ranges.empty() && ranges.back().decay == t.weight_decay && ranges.back().end == t.offset) {
      ranges.back().end = t.offset + t.numel;
    } else {
      ranges.push_back({t.offset, t.offset + t.numel, t.weight_decay});
    }
  }
  return ranges;
}

}  // namespace tf
