// The model's units (model/parameters.h): contiguous flat ranges in buffer order, and typed views
// of one unit's own storage; the activation plan without a model.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "model/gpt2.h"

namespace tf {
namespace {

const GPT2Config kTiny{.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 50, .block_size = 16,
                       .padded_vocab_size = 64};

TEST(GPT2Units, UnitsTileTheBufferInOrder) {
  const ParameterLayout layout(kTiny);
  const int L = kTiny.n_layer;
  ASSERT_EQ(NumUnits(layout), L + 2);
  int64_t at = 0;
  for (int u = 0; u < NumUnits(layout); ++u) {
    const auto [begin, end] = UnitRange(layout, u);
    EXPECT_EQ(begin, at) << "unit " << u;
    EXPECT_LT(begin, end) << "unit " << u;
    at = end;
  }
  EXPECT_EQ(at, layout.total());
  EXPECT_EQ(UnitRange(layout, 0).second, layout.Find("transformer.h.0.ln_1.weight")->offset);
  EXPECT_EQ(UnitRange(layout, L + 1).first, layout.Find("transformer.ln_f.weight")->offset);
  for (int l = 0; l < L; ++l) {
    EXPECT_EQ(UnitRange(layout, 1 + l), std::make_pair(layout.LayerBegin(l), layout.LayerEnd(l)));
  }
  // The grad-ready order: the units last to first.
  const auto ready = GradReadyRanges(layout);
  ASSERT_EQ(static_cast<int>(ready.size()), NumUnits(layout));
  for (int u = 0; u < NumUnits(layout); ++u) EXPECT_EQ(ready[static_cast<size_t>(NumUnits(layout) - 1 - u)], UnitRange(layout, u));
}

TEST(GPT2Units, ViewsPointAtTheNamedTensors) {
  const ParameterLayout layout(kTiny);
  std::vector<float> flat(static_cast<size_t>(layout.total()));
  float* base = flat.data();
  auto at = [&](const std::string& name) { return base + layout.Find(name)->offset; };
  auto unit = [&](int u) { return base + UnitRange(layout, u).first; };
  const EmbeddingView e = MakeEmbeddingView(layout, unit(0));
  EXPECT_EQ(e.wte, at("transformer.wte.weight"));
  EXPECT_EQ(e.wpe, at("transformer.wpe.weight"));
  for (int l = 0; l < kTiny.n_layer; ++l) {
    const BlockView b = MakeBlockView(layout, l, unit(1 + l));
    const std::string p = fmt::format("transformer.h.{}.", l);
    const float* got[] = {b.ln1_w, b.ln1_b, b.qkv_w, b.qkv_b, b.attproj_w, b.attproj_b,
                          b.ln2_w, b.ln2_b, b.fc_w,  b.fc_b,  b.fcproj_w,  b.fcproj_b};
    const char* names[] = {"ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
                           "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
                           "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
    for (int k = 0; k < 12; ++k) EXPECT_EQ(got[k], at(p + names[k])) << p << names[k];
  }
  const FinalNormView f = MakeFinalNormView(layout, unit(kTiny.n_layer + 1));
  EXPECT_EQ(f.lnf_w, at("transformer.ln_f.weight"));
  EXPECT_EQ(f.lnf_b, at("transformer.ln_f.bias"));
}

TEST(GPT2Units, ActivationBytesPlansWithoutAModel) {
  GPT2Config wide = kTiny;
  wide.n_layer = 3;
  wide.n_embd = 48;
  wide.n_head = 3;
  for (const GPT2Config& c : {kTiny, wide}) {
    for (auto [B, T] : {std::pair{1, 1}, std::pair{2, 8}, std::pair{3, 16}}) {
      auto m = GPT2::Create(c, B, T);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      EXPECT_EQ(GPT2::ActivationBytes(c, B, T), (*m)->activation_bytes()) << B << "x" << T;
    }
  }
  EXPECT_GT(GPT2::ActivationBytes(kTiny, 2, 8), GPT2::ActivationBytes(kTiny, 1, 8));
}

}  // namespace
}  // namespace tf
