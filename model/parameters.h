// The parameter layout of a GPT-2 model: one flat float buffer, described by a table of named
// views (name, shape, offset). Gradients, AdamW moments and (on GPU) master weights mirror the
// same layout, so communication and checkpointing can treat all state as flat buffers + this table.
//
// Names follow Hugging Face GPT-2 ("transformer.h.3.attn.c_attn.weight"); shapes are TrainFlow's
// in-memory shapes: linear weights are (out, in) row-major like torch.nn.Linear (HF's Conv1D
// stores the transpose; model/gpt2_weights.cpp converts), and wte has padded_vocab_size rows.
// Order in the buffer: wte, wpe, then each block in order, then ln_f — so one block's tensors are
// contiguous (a data-parallel bucket can cover whole blocks).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace tf {

struct ParamTensor {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in floats from the buffer start
  int64_t numel = 0;
  bool weight_decay = false;  // true for tensors with >= 2 dimensions (matrices, embeddings)
  int layer = -1;             // block index, or -1 for wte/wpe/ln_f
};

class ParameterLayout {
 public:
  explicit ParameterLayout(const GPT2Config& config);

  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  int64_t total() const { return total_; }
  // nullptr when no tensor has that name.
  const ParamTensor* Find(const std::string& name) const;
  // Flat range [begin, end) of block `layer`'s tensors.
  int64_t LayerBegin(int layer) const { return layer_begin_[static_cast<size_t>(layer)]; }
  int64_t LayerEnd(int layer) const { return layer_begin_[static_cast<size_t>(layer) + 1]; }
  int n_layer() const { return static_cast<int>(layer_begin_.size()) - 1; }

 private:
  std::vector<ParamTensor> tensors_;
  std::vector<int64_t> layer_begin_;  // n_layer + 1 entries
  int64_t total_ = 0;
};

// Units: the groups of parameters a sharded backend gathers, frees and reduces together, each one
// contiguous flat range, in buffer order: unit 0 = wte + wpe, unit 1 + l = block l, unit n_layer + 1
// = ln_f. The CPU model asks for its parameters and gradients unit by unit (model/gpt2.h UnitStorage).
int NumUnits(const ParameterLayout& layout);
// Flat range [begin, end) of `unit`. REQUIRES: 0 <= unit < NumUnits(layout).
std::pair<int64_t, int64_t> UnitRange(const ParameterLayout& layout, int unit);

// The flat ranges [begin, end) of a gradient buffer in the order a backward pass makes them final:
// ln_f, blocks n_layer-1 .. 0, then wte+wpe (the units, last to first). Both backends announce
// exactly these ranges through their grad-ready hooks; the data-parallel reducer plans its buckets
// from them.
std::vector<std::pair<int64_t, int64_t>> GradReadyRanges(const ParameterLayout& layout);

// The buffer as maximal runs of consecutive tensors with the same weight-decay flag, in order,
// covering [0, total()) exactly: what AdamW walks (one kernel launch or loop per run, or one launch
// over all runs on the GPU).
struct DecayRange {
  int64_t begin = 0, end = 0;
  bool decay = false;
};
std::vector<DecayRange> DecayRanges(const ParameterLayout& layout);

// Typed pointers into one unit's storage: `unit_base` points at UnitRange(layout, unit) size floats
// laid out as that unit's slice of the flat buffer (for the whole flat buffer `base`, pass
// base + UnitRange(layout, unit).first). Valid while that storage lives.
struct EmbeddingView {  // unit 0
  float* wte;  // (Vp, C)
  float* wpe;  // (block_size, C)
};
struct BlockView {  // unit 1 + layer
  float* ln1_w;     // (C)
  float* ln1_b;     // (C)
  float* qkv_w;     // (3C, C)
  float* qkv_b;     // (3C)
  float* attproj_w; // (C, C)
  float* attproj_b; // (C)
  float* ln2_w;     // (C)
  float* ln2_b;     // (C)
  float* fc_w;      // (4C, C)
  float* fc_b;      // (4C)
  float* fcproj_w;  // (C, 4C)
  float* fcproj_b;  // (C)
};
struct FinalNormView {  // unit n_layer + 1
  float* lnf_w;  // (C)
  float* lnf_b;  // (C)
};
EmbeddingView MakeEmbeddingView(const ParameterLayout& layout, float* unit_base);
// REQUIRES: 0 <= layer < layout.n_layer().
BlockView MakeBlockView(const ParameterLayout& layout, int layer, float* unit_base);
FinalNormView MakeFinalNormView(const ParameterLayout& layout, float* unit_base);

}  // namespace tf
