// Whole-model golden test: TrainFlow's GPT-2 against an independent float64 PyTorch
// implementation (scripts/pytorch_reference.py -> tests/data/gpt2_tiny_golden.safetensors,
// contents in docs/pytorch_reference.md): logits, loss, every parameter gradient, and five AdamW
// steps with weight decay and gradient clipping.
#include <cmath>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "engine/optimizer.h"
#include "model/gpt2.h"
#include "model/gpt2_weights.h"
#include "model/safetensors.h"

namespace tf {
namespace {

class GoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto file = ReadSafetensors(std::string(TF_SOURCE_DIR) + "/tests/data/gpt2_tiny_golden.safetensors");
    ASSERT_TRUE(file.ok()) << file.status().ToString();
    for (NamedTensor& t : file->tensors) tensors_[t.name] = std::move(t);
    meta_ = file->metadata;
    config_.n_layer = std::stoi(meta_.at("n_layer"));
    config_.n_head = std::stoi(meta_.at("n_head"));
    config_.n_embd = std::stoi(meta_.at("n_embd"));
    config_.vocab_size = std::stoi(meta_.at("vocab_size"));
    config_.block_size = std::stoi(meta_.at("block_size"));
    config_.padded_vocab_size = DefaultPaddedVocab(config_.vocab_size);  // 97 -> 128: exercises padding
    B_ = std::stoi(meta_.at("B"));
    T_ = std::stoi(meta_.at("T"));
    auto model = GPT2::Create(config_, B_, T_);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(*model);
    std::vector<NamedTensor> params;
    for (const auto& [name, t] : tensors_) {
      if (name.starts_with("transformer.")) params.push_back(t);
    }
    Status s = LoadHFTensors(params, config_, model_->params(), "golden");
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (float x : tensors_.at("golden.inputs").data) inputs_.push_back(static_cast<int32_t>(x));
    for (float x : tensors_.at("golden.targets").data) targets_.push_back(static_cast<int32_t>(x));
  }

  std::map<std::string, NamedTensor> tensors_;
  std::map<std::string, std::string> meta_;
  GPT2Config config_;
  int B_ = 0, T_ = 0;
  std::unique_ptr<GPT2> model_;
  std::vector<int32_t> inputs_, targets_;
};

TEST_F(GoldenTest, LogitsAndLossMatchPyTorch) {
  const float loss = model_->Forward(inputs_.data(), targets_.data(), B_, T_);
  // float32 forward through 2 blocks of width 32-128: relative error ~1e-6; 1e-5 leaves margin.
  EXPECT_NEAR(loss, tensors_.at("golden.loss").data[0], 1e-5);
  const auto& ref = tensors_.at("golden.logits").data;
  const int V = config_.vocab_size, Vp = config_.padded_vocab_size;
  double max_err = 0;
  for (int i = 0; i < B_ * T_; ++i) {
    for (int v = 0; v < V; ++v) {
      const double got = model_->logits()[static_cast<int64_t>(i) * Vp + v];
      max_err = std::max(max_err, std::fabs(got - ref[static_cast<size_t>(i * V + v)]));
      ASSERT_FALSE(std::isnan(got));
    }
  }
  EXPECT_LT(max_err, 2e-5);
}

TEST_F(GoldenTest, GradientsMatchPyTorch) {
  model_->ZeroGrad();
  const float loss = model_->ForwardBackward(inputs_.data(), targets_.data(), B_, T_, 1.0f);
  EXPECT_NEAR(loss, tensors_.at("golden.loss").data[0], 1e-5);
  for (const NamedTensor& g : ToHFTensors(config_, model_->grads())) {
    const NamedTensor& ref = tensors_.at("grad." + g.name);
    ASSERT_EQ(g.shape, ref.shape) << g.name;
    double max_ref = 0, max_err = 0;
    for (size_t i = 0; i < ref.data.size(); ++i) {
      max_ref = std::max(max_ref, static_cast<double>(std::fabs(ref.data[i])));
      ASSERT_FALSE(std::isnan(g.data[i])) << g.name << "[" << i << "]";
      max_err = std::max(max_err, static_cast<double>(std::fabs(g.data[i] - ref.data[i])));
    }
    // float32 backward: errors ~1e-6 of the tensor's largest gradient; 1e-4 relative (plus a floor
    // for tensors whose true gradient is ~0, e.g. unused wpe rows) flags any real bug, which shows
    // up at O(1) relative.
    EXPECT_LE(max_err, 1e-4 * max_ref + 1e-7) << g.name << " max|ref| " << max_ref;
  }
}

TEST_F(GoldenTest, FiveAdamWStepsMatchPyTorch) {
  AdamWConfig oc;
  oc.beta1 = std::stod(meta_.at("beta1"));
  oc.beta2 = std::stod(meta_.at("beta2"));
  oc.eps = std::stod(meta_.at("eps"));
  oc.weight_decay = std::stod(meta_.at("weight_decay"));
  oc.grad_clip = std::stod(meta_.at("grad_clip"));
  const double lr = std::stod(meta_.at("lr"));
  AdamW opt(model_->layout(), oc);
  const auto& ref_losses = tensors_.at("golden.losses_adamw").data;
  const auto& ref_norms = tensors_.at("golden.grad_norms_adamw").data;
  for (size_t step = 0; step < ref_losses.size(); ++step) {
    model_->ZeroGrad();
    const float loss = model_->ForwardBackward(inputs_.data(), targets_.data(), B_, T_, 1.0f);
    // The reference's float32 rerun differs by 8e-6 after 5 steps; allow 5e-5.
    EXPECT_NEAR(loss, ref_losses[step], 5e-5) << "step " << step;
    const float norm = opt.Step(model_->params(), model_->grads(), lr, static_cast<int64_t>(step) + 1);
    EXPECT_NEAR(norm, ref_norms[step], 1e-4 * ref_norms[step]) << "step " << step;
  }
  const int C = config_.n_embd;
  for (const NamedTensor& p : ToHFTensors(config_, model_->params())) {
    const NamedTensor& ref = tensors_.at("after." + p.name);
    for (size_t i = 0; i < ref.data.size(); ++i) {
      // Adam normalises every update to ~lr in size, so float32 rounding of tiny gradients can move
      // a parameter by up to lr per step. Measured float32-vs-float64 differences (PyTorch itself):
      // <= 2e-4 everywhere except the key slice of c_attn.bias, whose true gradient is exactly 0
      // (softmax is shift-invariant) so Adam amplifies rounding noise there (1.7e-3).
      const bool key_bias = p.name.ends_with("attn.c_attn.bias") && i >= static_cast<size_t>(C) &&
                            i < static_cast<size_t>(2 * C);
      const double tol = key_bias ? 5 * lr : 1e-3;
      ASSERT_NEAR(p.data[i], ref.data[i], tol) << p.name << "[" << i << "]";
    }
  }
}

}  // namespace
}  // namespace tf
