// Tests for model/gpt2_weights.h: Hugging Face GPT-2 safetensors export/import round trips
// bit-exactly (F32) or within the dtype's rounding (F16, BF16); the file follows HF's layout
// (transformer.* names, Conv1D weights stored (in, out), wte with vocab_size rows); the importer
// accepts GPT2Model names without the prefix, ignores attn.bias / attn.masked_bias and accepts
// lm_head.weight only when it equals wte (the heads are tied); missing, extra, duplicated,
// mis-shaped and non-finite tensors and a wrong n_layer are errors naming the tensor and file.
#include "model/gpt2_weights.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/gpt2.h"
#include "model/safetensors.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

// Tiny, with vocab 50 padded to 64 so the padded-row handling is exercised.
GPT2Config TinyConfig(int n_layer = 2) {
  GPT2Config c;
  c.n_layer = n_layer;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = 50;
  c.block_size = 8;
  c.padded_vocab_size = DefaultPaddedVocab(c.vocab_size);
  return c;
}

// A GPT-2 initialisation; then the 1-D tensors (zero biases, unit LayerNorm weights after
// InitWeights) are overwritten with random values so that every tensor is distinguishable and a
// swapped or dropped tensor cannot go unnoticed.
std::unique_ptr<GPT2> RandomModel(const GPT2Config& config, uint64_t seed) {
  auto m = GPT2::Create(config, 1, 1);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  std::unique_ptr<GPT2> model = std::move(*m);
  model->InitWeights(seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (const ParamTensor& t : model->layout().tensors()) {
    if (t.shape.size() != 1) continue;
    for (int64_t k = 0; k < t.numel; ++k) model->params()[static_cast<size_t>(t.offset + k)] = normal(rng);
  }
  return model;
}

std::unique_ptr<GPT2> EmptyModel(const GPT2Config& config) {
  auto m = GPT2::Create(config, 1, 1);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(*m);
}

bool BitIdentical(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class GPT2WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("tf_gpt2_weights_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    model_ = RandomModel(config_, 7);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // The model's tensors as HF would store them, read back from an exported file.
  std::vector<NamedTensor> ExportedTensors() {
    const std::string path = Path("export.safetensors");
    Status s = ExportHFWeights(path, config_, model_->params());
    EXPECT_TRUE(s.ok()) << s.ToString();
    auto file = ReadSafetensors(path);
    EXPECT_TRUE(file.ok()) << file.status().ToString();
    return std::move(file).value().tensors;
  }

  // Writes `tensors` with WriteSafetensors and imports the file into a fresh model.
  Status ImportCrafted(const std::vector<NamedTensor>& tensors, const std::string& name,
                       const GPT2Config* config = nullptr) {
    const GPT2Config& c = config ? *config : config_;
    std::vector<const NamedTensor*> ptrs;
    for (const NamedTensor& t : tensors) ptrs.push_back(&t);
    const std::string path = Path(name);
    Status w = WriteSafetensors(path, ptrs, {});
    EXPECT_TRUE(w.ok()) << w.ToString();
    imported_ = EmptyModel(c);
    return ImportHFWeights(path, c, imported_->params());
  }

  void ExpectError(const Status& s, const std::vector<std::string>& needles) {
    ASSERT_FALSE(s.ok()) << "expected an error naming " << needles.front();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    for (const std::string& n : needles) {
      EXPECT_NE(s.message().find(n), std::string::npos) << "expected '" << n << "' in: " << s.ToString();
    }
  }

  fs::path dir_;
  GPT2Config config_ = TinyConfig();
  std::unique_ptr<GPT2> model_;
  std::unique_ptr<GPT2> imported_;
};

NamedTensor* FindTensor(std::vector<NamedTensor>& ts, const std::string& name) {
  for (NamedTensor& t : ts) {
    if (t.name == name) return &t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return nullptr;
}

TEST_F(GPT2WeightsTest, F32ExportImportIsBitIdentical) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(ExportHFWeights(path, config_, model_->params(), {{"note", "x"}}).ok());
  auto fresh = EmptyModel(config_);
  Status s = ImportHFWeights(path, config_, fresh->params());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(BitIdentical(fresh->params(), model_->params()));
  // Metadata: the caller's plus "format": "pt".
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->metadata.at("note"), "x");
  EXPECT_EQ(file->metadata.at("format"), "pt");
}

TEST_F(GPT2WeightsTest, PaddedVocabularyRowsAreNotExportedAndImportAsZero) {
  // Garbage in the padded rows V..Vp-1 of the source must not reach the file.
  const ParamTensor* wte = model_->layout().Find("transformer.wte.weight");
  ASSERT_NE(wte, nullptr);
  const int64_t C = config_.n_embd, V = config_.vocab_size, Vp = config_.padded_vocab_size;
  ASSERT_GT(Vp, V);
  for (int64_t k = V * C; k < Vp * C; ++k) model_->params()[static_cast<size_t>(wte->offset + k)] = 123.0f;
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(ExportHFWeights(path, config_, model_->params()).ok());
  auto fresh = EmptyModel(config_);
  std::fill(fresh->params().begin(), fresh->params().end(), -1.0f);  // import must overwrite everything
  ASSERT_TRUE(ImportHFWeights(path, config_, fresh->params()).ok());
  for (int64_t k = 0; k < model_->layout().total(); ++k) {
    const bool padded = k >= wte->offset + V * C && k < wte->offset + Vp * C;
    const float want = padded ? 0.0f : model_->params()[static_cast<size_t>(k)];
    ASSERT_EQ(fresh->params()[static_cast<size_t>(k)], want) << "flat index " << k << (padded ? " (padded)" : "");
  }
}

TEST_F(GPT2WeightsTest, FileUsesHuggingFaceNamesShapesAndConv1DLayout) {
  std::vector<NamedTensor> ts = ExportedTensors();
  const ParameterLayout& layout = model_->layout();
  ASSERT_EQ(ts.size(), layout.tensors().size());
  const int64_t C = config_.n_embd;
  for (const NamedTensor& t : ts) {
    EXPECT_TRUE(t.name.starts_with("transformer.")) << t.name;
    EXPECT_NE(t.name, "lm_head.weight");
  }
  const std::span<const float> p = model_->params();

  // wte: vocab_size rows, not padded_vocab_size; row-major copy of the first V rows.
  NamedTensor* wte = FindTensor(ts, "transformer.wte.weight");
  ASSERT_NE(wte, nullptr);
  EXPECT_EQ(wte->shape, (std::vector<int64_t>{config_.vocab_size, C}));
  const int64_t wte_off = layout.Find("transformer.wte.weight")->offset;
  EXPECT_EQ(wte->data[static_cast<size_t>(49 * C + 3)], p[static_cast<size_t>(wte_off + 49 * C + 3)]);

  // attn.c_attn.weight: (out=3C, in=C) in memory, (in=C, out=3C) in the file.
  NamedTensor* qkv = FindTensor(ts, "transformer.h.1.attn.c_attn.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->shape, (std::vector<int64_t>{C, 3 * C}));
  const int64_t qkv_off = layout.Find("transformer.h.1.attn.c_attn.weight")->offset;
  const int64_t in = 5, out = 37;  // an element off the diagonal: file[in][out] == memory[out][in]
  EXPECT_EQ(qkv->data[static_cast<size_t>(in * 3 * C + out)], p[static_cast<size_t>(qkv_off + out * C + in)]);
  EXPECT_NE(qkv->data[static_cast<size_t>(in * 3 * C + out)], p[static_cast<size_t>(qkv_off + in * 3 * C + out)]);
  // Every element, for all four Conv1D weights of every layer.
  for (int l = 0; l < config_.n_layer; ++l) {
    for (const char* suffix : {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"}) {
      const std::string name = "transformer.h." + std::to_string(l) + "." + suffix;
      const ParamTensor* mem = layout.Find(name);
      NamedTensor* file = FindTensor(ts, name);
      ASSERT_NE(mem, nullptr);
      ASSERT_NE(file, nullptr);
      const int64_t O = mem->shape[0], I = mem->shape[1];
      ASSERT_EQ(file->shape, (std::vector<int64_t>{I, O})) << name;
      for (int64_t i = 0; i < I; ++i)
        for (int64_t o = 0; o < O; ++o)
          ASSERT_EQ(file->data[static_cast<size_t>(i * O + o)], p[static_cast<size_t>(mem->offset + o * I + i)])
              << name << " [" << i << "][" << o << "]";
    }
  }
  // 1-D tensors and wpe keep their shape.
  EXPECT_EQ(FindTensor(ts, "transformer.wpe.weight")->shape, (std::vector<int64_t>{config_.block_size, C}));
  EXPECT_EQ(FindTensor(ts, "transformer.h.0.mlp.c_fc.bias")->shape, (std::vector<int64_t>{4 * C}));
  EXPECT_EQ(FindTensor(ts, "transformer.ln_f.weight")->shape, (std::vector<int64_t>{C}));
}

TEST_F(GPT2WeightsTest, ToHFTensorsMatchesTheExportedFile) {
  const std::vector<NamedTensor> file = ExportedTensors();
  const std::vector<NamedTensor> mem = ToHFTensors(config_, model_->params());
  ASSERT_EQ(file.size(), mem.size());
  for (size_t k = 0; k < mem.size(); ++k) {
    EXPECT_EQ(mem[k].name, file[k].name);
    EXPECT_EQ(mem[k].shape, file[k].shape) << mem[k].name;
    EXPECT_EQ(mem[k].data, file[k].data) << mem[k].name;
  }
  auto fresh = EmptyModel(config_);
  Status s = LoadHFTensors(mem, config_, fresh->params(), "memory");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(BitIdentical(fresh->params(), model_->params()));
}

TEST_F(GPT2WeightsTest, NamesWithoutTransformerPrefixImport) {
  std::vector<NamedTensor> ts = ExportedTensors();
  for (NamedTensor& t : ts) t.name = t.name.substr(std::string("transformer.").size());  // GPT2Model names
  Status s = ImportCrafted(ts, "gpt2model.safetensors");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(BitIdentical(imported_->params(), model_->params()));
  // A mix of both spellings is fine as long as no tensor appears twice.
  for (size_t k = 0; k < ts.size(); k += 2) ts[k].name = "transformer." + ts[k].name;
  s = ImportCrafted(ts, "mixed.safetensors");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(BitIdentical(imported_->params(), model_->params()));
}

TEST_F(GPT2WeightsTest, BuffersAreIgnoredAndTiedLmHeadMustEqualWte) {
  std::vector<NamedTensor> ts = ExportedTensors();
  const int64_t T = config_.block_size;
  // As in Hugging Face checkpoints: the causal mask buffer, masked_bias, and the tied LM head.
  for (int l = 0; l < config_.n_layer; ++l) {
    ts.push_back({"transformer.h." + std::to_string(l) + ".attn.bias", {1, 1, T, T},
                  std::vector<float>(static_cast<size_t>(T * T), 1.0f)});
    ts.push_back({"h." + std::to_string(l) + ".attn.masked_bias", {}, {-1e4f}});
  }
  const NamedTensor* wte = nullptr;
  for (const NamedTensor& t : ts) {
    if (t.name == "wte.weight" || t.name == "transformer.wte.weight") wte = &t;
  }
  ASSERT_NE(wte, nullptr);
  ts.push_back({"lm_head.weight", wte->shape, wte->data});
  Status s = ImportCrafted(ts, "hf_full.safetensors");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(BitIdentical(imported_->params(), model_->params()));

  // An untied head would be silently dropped: it is refused, naming the tensor.
  ts.back().data[3] += 1.0f;
  ExpectError(ImportCrafted(ts, "untied.safetensors"), {"lm_head.weight differs from transformer.wte.weight",
                                                        "untied.safetensors"});
  ts.back().shape = {config_.n_embd, config_.vocab_size};
  ExpectError(ImportCrafted(ts, "transposed.safetensors"), {"lm_head.weight has shape", "transposed.safetensors"});
}

TEST_F(GPT2WeightsTest, NonFiniteValueIsAnErrorNamingTensorAndElement) {
  for (const float bad : {std::nanf(""), std::numeric_limits<float>::infinity()}) {
    std::vector<NamedTensor> ts = ExportedTensors();
    for (NamedTensor& t : ts) {
      if (t.name == "transformer.h.1.ln_2.weight") t.data[5] = bad;
    }
    ExpectError(ImportCrafted(ts, "nan.safetensors"), {"transformer.h.1.ln_2.weight", "element 5", "nan.safetensors"});
  }
}

TEST_F(GPT2WeightsTest, MissingTensorIsAnErrorNamingIt) {
  std::vector<NamedTensor> ts = ExportedTensors();
  std::erase_if(ts, [](const NamedTensor& t) { return t.name == "transformer.h.1.mlp.c_fc.bias"; });
  ExpectError(ImportCrafted(ts, "missing.safetensors"), {"transformer.h.1.mlp.c_fc.bias", "missing.safetensors"});
}

TEST_F(GPT2WeightsTest, ExtraTensorIsAnErrorNamingIt) {
  std::vector<NamedTensor> ts = ExportedTensors();
  ts.push_back({"transformer.h.0.attn.rotary.weight", {2}, {1.0f, 2.0f}});
  ExpectError(ImportCrafted(ts, "extra.safetensors"), {"transformer.h.0.attn.rotary.weight", "extra.safetensors"});
}

TEST_F(GPT2WeightsTest, DuplicatedTensorIsAnError) {
  std::vector<NamedTensor> ts = ExportedTensors();
  NamedTensor dup = *FindTensor(ts, "transformer.ln_f.bias");
  dup.name = "ln_f.bias";
  ts.push_back(dup);
  ExpectError(ImportCrafted(ts, "dup.safetensors"), {"ln_f.bias", "dup.safetensors"});
}

TEST_F(GPT2WeightsTest, WrongShapeIsAnErrorNamingTheTensor) {
  {
    // c_attn.weight in TrainFlow's (out, in) layout instead of HF's (in, out).
    std::vector<NamedTensor> ts = ExportedTensors();
    NamedTensor* t = FindTensor(ts, "transformer.h.0.attn.c_attn.weight");
    ASSERT_NE(t, nullptr);
    std::swap(t->shape[0], t->shape[1]);
    ExpectError(ImportCrafted(ts, "transposed.safetensors"),
                {"transformer.h.0.attn.c_attn.weight", "transposed.safetensors", "[48, 16]", "[16, 48]"});
  }
  {
    // wte with padded_vocab_size rows (64) where the file must have vocab_size (50).
    std::vector<NamedTensor> ts = ExportedTensors();
    NamedTensor* t = FindTensor(ts, "transformer.wte.weight");
    ASSERT_NE(t, nullptr);
    t->shape[0] = config_.padded_vocab_size;
    t->data.resize(static_cast<size_t>(config_.padded_vocab_size * config_.n_embd), 0.0f);
    ExpectError(ImportCrafted(ts, "padded_wte.safetensors"), {"transformer.wte.weight", "[64, 16]", "[50, 16]"});
  }
  {
    // A 1-D tensor of the wrong length.
    std::vector<NamedTensor> ts = ExportedTensors();
    NamedTensor* t = FindTensor(ts, "transformer.h.1.ln_2.weight");
    ASSERT_NE(t, nullptr);
    t->shape = {15};
    t->data.resize(15);
    ExpectError(ImportCrafted(ts, "short_ln.safetensors"), {"transformer.h.1.ln_2.weight"});
  }
}

TEST_F(GPT2WeightsTest, LayerCountMismatchIsAnError) {
  // A 3-layer file into a 2-layer config: h.2.* is not a parameter of this config.
  auto deep = RandomModel(TinyConfig(3), 3);
  const std::string deep_path = Path("deep.safetensors");
  ASSERT_TRUE(ExportHFWeights(deep_path, deep->config(), deep->params()).ok());
  auto two = EmptyModel(config_);
  ExpectError(ImportHFWeights(deep_path, config_, two->params()), {"transformer.h.2.", "n_layer=2", deep_path});

  // A 1-layer file into the 2-layer config: h.1.* is missing.
  auto shallow = RandomModel(TinyConfig(1), 4);
  const std::string shallow_path = Path("shallow.safetensors");
  ASSERT_TRUE(ExportHFWeights(shallow_path, shallow->config(), shallow->params()).ok());
  ExpectError(ImportHFWeights(shallow_path, config_, two->params()), {"transformer.h.1.", shallow_path});
}

TEST_F(GPT2WeightsTest, MissingFileIsNotFound) {
  auto fresh = EmptyModel(config_);
  const std::string path = Path("nope.safetensors");
  Status s = ImportHFWeights(path, config_, fresh->params());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.ToString();
}

// F16 / BF16 exports re-import within the dtype's round-to-nearest error: half an ulp, i.e. a
// relative 2^-11 (F16, 10 explicit mantissa bits) or 2^-8 (BF16, 7 bits) of the value, plus for
// F16 half the subnormal spacing 2^-24 below its smallest normal 2^-14 (init values are
// normal(0, 0.02), so some are tiny).
TEST_F(GPT2WeightsTest, HalfPrecisionExportsReimportWithinRounding) {
  struct Case {
    SafetensorsDtype dtype;
    const char* name;
    double rel, abs;
  };
  const Case cases[] = {{SafetensorsDtype::kF16, "f16", std::ldexp(1.0, -11), std::ldexp(1.0, -25)},
                        {SafetensorsDtype::kBF16, "bf16", std::ldexp(1.0, -8), 0.0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = Path(std::string("model_") + c.name + ".safetensors");
    ASSERT_TRUE(ExportHFWeights(path, config_, model_->params(), {}, c.dtype).ok());
    auto fresh = EmptyModel(config_);
    Status s = ImportHFWeights(path, config_, fresh->params());
    ASSERT_TRUE(s.ok()) << s.ToString();
    int rounded = 0;
    for (size_t k = 0; k < model_->params().size(); ++k) {
      const float want = model_->params()[k], got = fresh->params()[k];
      ASSERT_LE(std::fabs(static_cast<double>(got) - want), c.rel * std::fabs(want) + c.abs)
          << "flat index " << k << ": " << want << " -> " << got;
      rounded += got != want;
      if (c.dtype == SafetensorsDtype::kBF16) {
        uint32_t bits;
        std::memcpy(&bits, &got, 4);
        ASSERT_EQ(bits & 0xffffu, 0u) << "not a bf16 value at flat index " << k;
      }
    }
    EXPECT_GT(rounded, 0) << "the file was not actually stored in reduced precision";
    // Re-exporting the rounded values at the same dtype and importing again is exact.
    const std::string again = Path(std::string("again_") + c.name + ".safetensors");
    ASSERT_TRUE(ExportHFWeights(again, config_, fresh->params(), {}, c.dtype).ok());
    auto fresh2 = EmptyModel(config_);
    ASSERT_TRUE(ImportHFWeights(again, config_, fresh2->params()).ok());
    EXPECT_TRUE(BitIdentical(fresh2->params(), fresh->params()));
  }
}

TEST(HFConfigJsonTest, DescribesTheModel) {
  const GPT2Config c = TinyConfig();
  const nlohmann::json j = nlohmann::json::parse(HFConfigJson(c));
  EXPECT_EQ(j.at("model_type"), "gpt2");
  EXPECT_EQ(j.at("n_layer"), c.n_layer);
  EXPECT_EQ(j.at("n_head"), c.n_head);
  EXPECT_EQ(j.at("n_embd"), c.n_embd);
  EXPECT_EQ(j.at("vocab_size"), c.vocab_size);  // the real vocabulary, not the padded one
  EXPECT_EQ(j.at("n_positions"), c.block_size);
  EXPECT_EQ(j.at("activation_function"), "gelu_new");
  EXPECT_EQ(j.at("tie_word_embeddings"), true);
  EXPECT_EQ(j.at("torch_dtype"), "float32");
}

TEST(HFConfigJsonTest, DtypeAndSpecialTokensFollowTheExportAndTheTokenizer) {
  GPT2Config c = TinyConfig();
  nlohmann::json j = nlohmann::json::parse(HFConfigJson(c, "byte", SafetensorsDtype::kBF16));
  EXPECT_EQ(j.at("torch_dtype"), "bfloat16");
  EXPECT_TRUE(j.at("bos_token_id").is_null());  // the byte tokenizer has no end-of-text token
  EXPECT_TRUE(j.at("eos_token_id").is_null());
  j = nlohmann::json::parse(HFConfigJson(c, "gpt2", SafetensorsDtype::kF16));
  EXPECT_EQ(j.at("torch_dtype"), "float16");
  EXPECT_EQ(j.at("eos_token_id"), 50256);
  c.vocab_size = 50257;
  c.padded_vocab_size = 50304;
  j = nlohmann::json::parse(HFConfigJson(c));  // unrecorded: decided by the vocabulary
  EXPECT_EQ(j.at("bos_token_id"), 50256);
}

}  // namespace
}  // namespace tf
