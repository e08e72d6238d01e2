// The model's units (model/parameters.h) and its unit storage (model/gpt2.h UnitStorage): a model
// with external storage, fed per-unit copies of a normal model's parameters, computes bit-identical
// losses, logits and gradients, calls the storage in the documented order, and touches no unit's
// parameters after releasing them nor its gradient after GradsDone.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "kernels/random.h"
#include "model/gpt2.h"

namespace tf {
namespace {

const GPT2Config kTiny{.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 50, .block_size = 16,
                       .padded_vocab_size = 64};
constexpr int kB = 2, kT = 8;

bool SameBits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}
bool SameBits(float a, float b) { return SameBits(&a, &b, 1); }

// Per-unit copies of a flat parameter buffer and per-unit gradients, each one float past an
// allocation's start (so not 64-byte aligned, unlike the model's own buffers). A released unit's
// parameters and a finished unit's gradient are overwritten with NaN until acquired again (a
// finished gradient is kept aside and put back), so a use after release shows in the results.
// Records every call as "<call> <unit>".
class RecordingStorage final : public UnitStorage {
 public:
  RecordingStorage(const ParameterLayout& layout, std::span<const float> flat) {
    for (int u = 0; u < NumUnits(layout); ++u) {
      const auto [begin, end] = UnitRange(layout, u);
      master_.emplace_back(flat.begin() + begin, flat.begin() + end);
      work_.emplace_back(end - begin + 1, kNaN);
      grads_.emplace_back(end - begin + 1, kNaN);
      final_grads_.emplace_back(end - begin, 0.0f);
    }
    params_held_.assign(master_.size(), false);
    grads_held_.assign(master_.size(), false);
  }

  float* AcquireParams(int unit) override {
    Record("AcquireParams", unit);
    float* p = Hand(params_held_, unit, master_, work_);
    max_params_held_ = std::max(max_params_held_, static_cast<int>(std::count(params_held_.begin(),
                                                                              params_held_.end(), true)));
    return p;
  }
  void ReleaseParams(int unit) override {
    Record("ReleaseParams", unit);
    TakeBack(params_held_, unit, nullptr, work_);
  }
  void Prefetch(int unit) override { Record("Prefetch", unit); }
  float* AcquireGrads(int unit) override {
    Record("AcquireGrads", unit);
    return Hand(grads_held_, unit, final_grads_, grads_);
  }
  void GradsDone(int unit) override {
    Record("GradsDone", unit);
    TakeBack(grads_held_, unit, &final_grads_, grads_);
  }

  // The accumulated gradient of `unit` as of its last GradsDone.
  const std::vector<float>& grads(int unit) const { return final_grads_[Index(unit)]; }
  bool nothing_held() const {
    return std::none_of(params_held_.begin(), params_held_.end(), [](bool b) { return b; }) &&
           std::none_of(grads_held_.begin(), grads_held_.end(), [](bool b) { return b; });
  }
  int max_params_held() const { return max_params_held_; }
  std::vector<std::string> calls;

 private:
  static constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  static size_t Index(int unit) { return static_cast<size_t>(unit); }
  void Record(const char* call, int unit) { calls.push_back(fmt::format("{} {}", call, unit)); }
  // Copies the unit's `from` into its `to` buffer (past the first float) and hands that out.
  static float* Hand(std::vector<bool>& held, int unit, const std::vector<std::vector<float>>& from,
                     std::vector<std::vector<float>>& to) {
    EXPECT_FALSE(held[Index(unit)]) << "unit " << unit << " acquired twice";
    held[Index(unit)] = true;
    std::copy(from[Index(unit)].begin(), from[Index(unit)].end(), to[Index(unit)].begin() + 1);
    return to[Index(unit)].data() + 1;
  }
  // Keeps the handed-out buffer in `keep` (when non-null) and overwrites it with NaN.
  static void TakeBack(std::vector<bool>& held, int unit, std::vector<std::vector<float>>* keep,
                       std::vector<std::vector<float>>& buf) {
    EXPECT_TRUE(held[Index(unit)]) << "unit " << unit << " given back but not held";
    held[Index(unit)] = false;
    if (keep != nullptr) std::copy(buf[Index(unit)].begin() + 1, buf[Index(unit)].end(), (*keep)[Index(unit)].begin());
    std::fill(buf[Index(unit)].begin(), buf[Index(unit)].end(), kNaN);
  }

  std::vector<std::vector<float>> master_, work_, grads_, final_grads_;
  std::vector<bool> params_held_, grads_held_;
  int max_params_held_ = 0;
};

// The call order documented in model/gpt2.h (UnitStorage), written out independently.
std::vector<std::string> ExpectedForward(int L) {
  std::vector<std::string> c = {"AcquireParams 0", "Prefetch 1"};
  for (int l = 0; l < L; ++l) {
    c.push_back(fmt::format("AcquireParams {}", 1 + l));
    c.push_back(fmt::format("Prefetch {}", 2 + l));
    c.push_back(fmt::format("ReleaseParams {}", 1 + l));
  }
  for (const std::string& s : {fmt::format("AcquireParams {}", L + 1), fmt::format("ReleaseParams {}", L + 1),
                               std::string("ReleaseParams 0")}) {
    c.push_back(s);
  }
  return c;
}

std::vector<std::string> ExpectedForwardBackward(int L) {
  std::vector<std::string> c = ExpectedForward(L);
  for (const std::string& s : {std::string("AcquireParams 0"), fmt::format("AcquireParams {}", L + 1),
                               fmt::format("Prefetch {}", L), std::string("AcquireGrads 0"),
                               fmt::format("AcquireGrads {}", L + 1), fmt::format("GradsDone {}", L + 1),
                               fmt::format("ReleaseParams {}", L + 1)}) {
    c.push_back(s);
  }
  for (int l = L - 1; l >= 0; --l) {
    c.push_back(fmt::format("AcquireParams {}", 1 + l));
    if (l > 0) c.push_back(fmt::format("Prefetch {}", l));
    c.push_back(fmt::format("AcquireGrads {}", 1 + l));
    c.push_back(fmt::format("GradsDone {}", 1 + l));
    c.push_back(fmt::format("ReleaseParams {}", 1 + l));
  }
  c.push_back("GradsDone 0");
  c.push_back("ReleaseParams 0");
  return c;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
};
Batch RandomBatch(uint64_t seed) {
  Rng rng(seed);
  Batch b;
  for (int i = 0; i < kB * kT; ++i) {
    b.inputs.push_back(static_cast<int32_t>(rng.Below(kTiny.vocab_size)));
    b.targets.push_back(static_cast<int32_t>(rng.Below(kTiny.vocab_size)));
  }
  return b;
}

std::unique_ptr<GPT2> MustCreate(const GPT2Config& c, int B, int T, bool external) {
  auto m = GPT2::Create(c, B, T, external);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

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
  auto ready = GradReadyRanges(layout);
  ASSERT_EQ(static_cast<int>(ready.size()), NumUnits(layout));
  std::reverse(ready.begin(), ready.end());
  for (int u = 0; u < NumUnits(layout); ++u) EXPECT_EQ(ready[static_cast<size_t>(u)], UnitRange(layout, u));
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

TEST(GPT2Units, ExternalStorageIsBitIdentical) {
  auto normal = MustCreate(kTiny, kB, kT, false);
  auto external = MustCreate(kTiny, kB, kT, true);
  ASSERT_TRUE(normal && external);
  normal->InitWeights(7);
  RecordingStorage storage(normal->layout(), normal->params());
  external->set_unit_storage(&storage);
  std::vector<std::pair<int64_t, int64_t>> announced;
  normal->set_grad_ready_hook([&](int64_t b, int64_t e) { announced.emplace_back(b, e); });
  external->set_grad_ready_hook([&](int64_t, int64_t) { ADD_FAILURE() << "hook called with a unit storage set"; });

  const int64_t logits_n = int64_t{kB} * kT * kTiny.padded_vocab_size;
  normal->ZeroGrad();
  for (uint64_t micro = 0; micro < 2; ++micro) {
    const Batch b = RandomBatch(micro);
    const float want = normal->ForwardBackward(b.inputs.data(), b.targets.data(), kB, kT, 0.5f);
    const float got = external->ForwardBackward(b.inputs.data(), b.targets.data(), kB, kT, 0.5f);
    EXPECT_TRUE(SameBits(want, got)) << "micro-batch " << micro << ": " << want << " vs " << got;
    EXPECT_TRUE(std::isfinite(got));
    // The logits buffer holds dlogits after ForwardBackward: the same bits too.
    EXPECT_TRUE(SameBits(normal->logits(), external->logits(), logits_n)) << "micro-batch " << micro;
    EXPECT_TRUE(storage.nothing_held());
  }
  EXPECT_EQ(announced.size(), 2 * GradReadyRanges(normal->layout()).size());
  announced.resize(GradReadyRanges(normal->layout()).size());
  EXPECT_EQ(announced, GradReadyRanges(normal->layout()));
  for (int u = 0; u < NumUnits(normal->layout()); ++u) {
    const auto [begin, end] = UnitRange(normal->layout(), u);
    ASSERT_EQ(static_cast<int64_t>(storage.grads(u).size()), end - begin);
    EXPECT_TRUE(SameBits(normal->grads().data() + begin, storage.grads(u).data(), end - begin)) << "unit " << u;
  }

  // Forward only, with and without targets.
  const Batch b = RandomBatch(9);
  const float want = normal->Forward(b.inputs.data(), b.targets.data(), kB, kT);
  const float got = external->Forward(b.inputs.data(), b.targets.data(), kB, kT);
  EXPECT_TRUE(SameBits(want, got)) << want << " vs " << got;
  EXPECT_TRUE(SameBits(normal->logits(), external->logits(), logits_n));
  EXPECT_EQ(external->Forward(b.inputs.data(), nullptr, kB, kT), 0.0f);
  EXPECT_TRUE(SameBits(normal->logits(), external->logits(), logits_n));
}

TEST(GPT2Units, CallsFollowTheDocumentedOrder) {
  for (int n_layer : {1, 3}) {
    GPT2Config c = kTiny;
    c.n_layer = n_layer;
    auto m = MustCreate(c, kB, kT, true);
    ASSERT_TRUE(m);
    std::vector<float> flat(static_cast<size_t>(m->layout().total()));
    InitGPT2Weights(c, 1, flat);
    RecordingStorage storage(m->layout(), flat);
    m->set_unit_storage(&storage);
    const Batch b = RandomBatch(3);
    m->Forward(b.inputs.data(), b.targets.data(), kB, kT);
    EXPECT_EQ(storage.calls, ExpectedForward(n_layer)) << "n_layer " << n_layer;
    storage.calls.clear();
    m->ForwardBackward(b.inputs.data(), b.targets.data(), kB, kT, 1.0f);
    EXPECT_EQ(storage.calls, ExpectedForwardBackward(n_layer)) << "n_layer " << n_layer;
    EXPECT_TRUE(storage.nothing_held());
    // Unit 0 and one other: the parameter memory a sharded pass needs beyond its shards.
    EXPECT_EQ(storage.max_params_held(), 2);
    for (int u = 0; u < NumUnits(m->layout()); ++u) {
      EXPECT_EQ(std::count(storage.calls.begin(), storage.calls.end(), fmt::format("GradsDone {}", u)), 1) << u;
    }
  }
}

TEST(GPT2Units, ExternalModelOwnsNoParametersAndNeedsAStorage) {
  auto m = MustCreate(kTiny, kB, kT, true);
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->external_storage());
  EXPECT_TRUE(m->params().empty());
  EXPECT_TRUE(m->grads().empty());
  m->ZeroGrad();
  m->InitWeights(1);
  const Batch b = RandomBatch(1);
  EXPECT_TRUE(std::isnan(m->Forward(b.inputs.data(), b.targets.data(), kB, kT)));
  EXPECT_TRUE(std::isnan(m->ForwardBackward(b.inputs.data(), b.targets.data(), kB, kT, 1.0f)));
}

TEST(GPT2Units, ActivationBytesPlansWithoutAModel) {
  GPT2Config wide = kTiny;
  wide.n_layer = 3;
  wide.n_embd = 48;
  wide.n_head = 3;
  for (const GPT2Config& c : {kTiny, wide}) {
    for (auto [B, T] : {std::pair{1, 1}, std::pair{2, 8}, std::pair{3, 16}}) {
      for (bool external : {false, true}) {
        auto m = MustCreate(c, B, T, external);
        ASSERT_TRUE(m);
        EXPECT_EQ(GPT2::ActivationBytes(c, B, T), m->activation_bytes()) << B << "x" << T << " " << external;
      }
    }
  }
  EXPECT_GT(GPT2::ActivationBytes(kTiny, 2, 8), GPT2::ActivationBytes(kTiny, 1, 8));
}

}  // namespace
}  // namespace tf
