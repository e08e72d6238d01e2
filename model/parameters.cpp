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

int NumUnits(const ParameterLayout& layout) { return layout.n_layer() + 2; }

std::pair<int64_t, int64_t> UnitRange(const ParameterLayout& layout, int unit) {
  const int L = layout.n_layer();
  if (unit == 0) return {0, layout.LayerBegin(0)};
  if (unit <= L) return {layout.LayerBegin(unit - 1), layout.LayerEnd(unit - 1)};
  return {layout.LayerBegin(L), layout.total()};
}

std::vector<std::pair<int64_t, int64_t>> GradReadyRanges(const ParameterLayout& layout) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int unit = NumUnits(layout) - 1; unit >= 0; --unit) out.push_back(UnitRange(layout, unit));
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

EmbeddingView MakeEmbeddingView(const ParameterLayout& layout, float* unit_base) {
  const auto& t = layout.tensors();
  return {unit_base + t[0].offset, unit_base + t[1].offset};
}

BlockView MakeBlockView(const ParameterLayout& layout, int layer, float* unit_base) {
  const ParamTensor* p = &layout.tensors()[2 + 12 * static_cast<size_t>(layer)];
  const int64_t begin = layout.LayerBegin(layer);
  auto at = [&](int k) { return unit_base + (p[k].offset - begin); };
  return {at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7), at(8), at(9), at(10), at(11)};
}

FinalNormView MakeFinalNormView(const ParameterLayout& layout, float* unit_base) {
  const auto& t = layout.tensors();
  const int64_t begin = layout.LayerBegin(layout.n_layer());
  return {unit_base + (t[t.size() - 2].offset - begin), unit_base + (t[t.size() - 1].offset - begin)};
}

}  // namespace tf
