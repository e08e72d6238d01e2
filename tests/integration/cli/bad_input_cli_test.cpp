// Hostile input through the real binary: each case once crashed, hung, lost work or misled (deep
// JSON, out_dir problems found only after training, damaged weights accepted, FIFOs, absurd flag
// values, silently ignored tensors and keys, unhelpful messages). Now each is refused before any
// work with exit code 2 (bad input) or 4 (the OS refused), and a message naming the culprit.
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <functional>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tests/integration/cli_fixture.h"
#include "tests/test_net.h"

namespace tf {
namespace {

using cli_testing::CliFixture;
using cli_testing::kByteTiny;
using cli_testing::ReadAll;
using cli_testing::RunResult;
namespace fs = std::filesystem;

class BadInput : public CliFixture {
 protected:
  void SetUp() override {
    CliFixture::SetUp();
    train_bin_ = TokenFile("train.bin", 400);
    val_bin_ = TokenFile("val.bin", 200);
  }
  void Write(const std::string& name, const std::string& content) { std::ofstream(Path(name), std::ios::binary) << content; }
  // A trained byte-tiny model.safetensors (with its config in the metadata) at Path("good/").
  std::string GoodWeights() {
    const RunResult r = Run({"train", "--model", kByteTiny, "--train_data", train_bin_, "--max_steps", "1",
                             "--batch_size", "1", "--seq_len", "8", "--sample_tokens", "0", "--eval_batches", "0",
                             "--out_dir", Path("good"), "--fresh"});
    EXPECT_EQ(r.exit_code, 0) << r;
    return Path("good/model.safetensors");
  }
  // `name` = good weights with one tensor changed by `edit` (metadata kept).
  std::string EditedWeights(const std::string& name, const std::function<void(SafetensorsContents&)>& edit) {
    auto c = ReadSafetensors(GoodWeights());
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    edit(*c);
    std::vector<const NamedTensor*> ts;
    for (const NamedTensor& t : c->tensors) ts.push_back(&t);
    EXPECT_TRUE(WriteSafetensors(Path(name), ts, c->metadata).ok());
    return Path(name);
  }
  // Failed before the first step: nothing trained, nothing written.
  void ExpectNoStep(const RunResult& r) { EXPECT_EQ(r.out.find("step     1/"), std::string::npos) << r; }

  std::string train_bin_, val_bin_;
};

std::string Nested(int depth) { return std::string(static_cast<size_t>(depth), '[') + std::string(static_cast<size_t>(depth), ']'); }

TEST_F(BadInput, DeeplyNestedJsonIsRefusedNotACrash) {
  // In an ignored "_note" of the model config, in a training config value, and in the model
  // config stored in a safetensors file's metadata (read by eval/sample without --model).
  auto model = nlohmann::json::parse(ReadAll(kByteTiny));
  std::string text = model.dump();
  text.insert(text.size() - 1, ", \"_note\": " + Nested(60000));
  Write("deep_model.json", text);
  RunResult r = Train({"--train_data", train_bin_}, Path("deep_model.json"));
  ExpectCleanFailure(r, {"deep_model.json", "nested more than 64 levels"});

  Write("deep_train.json", "{\"lr\": " + Nested(60000) + "}");
  r = Train({"--train_data", train_bin_, "--train", Path("deep_train.json")});
  ExpectCleanFailure(r, {"deep_train.json", "nested more than 64 levels"});

  const std::string weights = EditedWeights("deep_meta.safetensors", [](SafetensorsContents& c) {
    c.metadata["trainflow.model_config"] = Nested(60000);
  });
  for (const char* cmd : {"eval", "sample"}) {
    std::vector<std::string> args = {cmd, "--weights", weights};
    if (std::string(cmd) == "eval") args.insert(args.end(), {"--data", val_bin_});
    ExpectCleanFailure(Run(args), {"deep_meta.safetensors", "nested more than 64 levels"});
  }
}

TEST_F(BadInput, ErrorMessagesQuoteABoundedPartOfHugeValues) {
  auto model = nlohmann::json::parse(ReadAll(kByteTiny));
  model["n_layer"] = std::string(1 << 20, 'x');
  Write("huge.json", model.dump());
  const RunResult r = Train({"--train_data", train_bin_}, Path("huge.json"));
  ExpectCleanFailure(r, {"n_layer", "huge.json"});
  EXPECT_LT(r.err.size(), 2000u) << r.err.substr(0, 2000);
}

TEST_F(BadInput, DuplicateJsonKeysAreRefused) {
  auto model = nlohmann::json::parse(ReadAll(kByteTiny));
  std::string text = model.dump();
  text.insert(1, "\"n_layer\": 7, ");
  Write("dup.json", text);
  ExpectCleanFailure(Train({"--train_data", train_bin_}, Path("dup.json")), {"dup.json", "'n_layer' appears more than once"});
  Write("dup_train.json", "{\"lr\": 1e-3, \"nested\": {\"a\": 1, \"a\": 2}}");
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--train", Path("dup_train.json")}),
                     {"dup_train.json", "'a' appears more than once"});
}

TEST_F(BadInput, OutDirProblemsAreFoundBeforeTheFirstStep) {
  Write("a_file", "x");
  RunResult r = Train({"--train_data", train_bin_, "--out_dir", Path("a_file")});
  ExpectCleanFailure(r, {"a_file", "not a directory"});
  ExpectNoStep(r);
  r = Train({"--train_data", train_bin_, "--out_dir", Path("a_file/sub")});
  ExpectCleanFailure(r, {"a_file", "not a directory"});
  ExpectNoStep(r);
  // Unwritable even for root: /proc refuses new entries.
  r = Train({"--train_data", train_bin_, "--out_dir", "/proc/trainflow_out"});
  ExpectCleanFailure(r, {"/proc/trainflow_out"});
  ExpectNoStep(r);
  std::ofstream(Path("train.json")) << "{\"out_dir\": \"\"}";
  r = Train({"--train_data", train_bin_, "--train", Path("train.json")});
  // The fixture's --out_dir override wins; without it the empty key is refused.
  EXPECT_EQ(r.exit_code, 0) << r;
  r = Run({"train", "--model", kByteTiny, "--train", Path("train.json"), "--train_data", train_bin_, "--max_steps", "1",
           "--seq_len", "8", "--batch_size", "1"});
  ExpectCleanFailure(r, {"'out_dir' is empty"});
  ExpectNoStep(r);
}

// A state no machine holds: refused before anything is allocated, naming the bytes by kind and the
// memory there is, not an OOM kill mid-run.
TEST_F(BadInput, AStateThatCannotFitIsRefusedUpFront) {
  std::ofstream(Path("huge.json")) << R"({"n_layer": 200, "n_head": 64, "n_embd": 8192, "vocab_size": 256,
                                          "padded_vocab_size": 256, "block_size": 64})";
  RunResult r = Run({"train", "--model", Path("huge.json"), "--train_data", train_bin_, "--out_dir", Path("out"),
                     "--seq_len", "8", "--batch_size", "1", "--device", "cpu"});
  ExpectCleanFailure(r, {"zero_stage 0 needs", "GiB per rank", "params", "moments", "MemAvailable"});
  ExpectNoStep(r);
}

TEST_F(BadInput, NonFiniteWeightsAreRefusedNamingTheTensor) {
  const std::string bad = EditedWeights("nan.safetensors", [](SafetensorsContents& c) {
    for (NamedTensor& t : c.tensors) {
      if (t.name == "transformer.h.1.attn.c_attn.weight") t.data[7] = std::nanf("");
    }
  });
  const std::vector<std::string> needles = {"nan.safetensors", "transformer.h.1.attn.c_attn.weight", "element 7"};
  ExpectCleanFailure(Run({"eval", "--weights", bad, "--data", val_bin_}), needles);
  ExpectCleanFailure(Run({"sample", "--weights", bad, "--tokens", "2"}), needles);
  ExpectCleanFailure(Run({"export", "--weights", bad, "--out", Path("exported")}), needles);
  EXPECT_FALSE(fs::exists(Path("exported/model.safetensors")));
  RunResult r = Train({"--train_data", train_bin_, "--init_from", bad});
  ExpectCleanFailure(r, needles);
  EXPECT_EQ(r.err.find("lr"), std::string::npos) << r;  // not blamed on the learning rate
  const std::string inf = EditedWeights("inf.safetensors", [](SafetensorsContents& c) {
    c.tensors[0].data[0] = -INFINITY;
  });
  ExpectCleanFailure(Run({"eval", "--weights", inf, "--data", val_bin_}), {"inf.safetensors", "-inf"});
}

TEST_F(BadInput, UntiedOrMisshapenLmHeadIsRefused) {
  const std::string untied = EditedWeights("untied.safetensors", [](SafetensorsContents& c) {
    for (const NamedTensor& t : c.tensors) {
      if (t.name == "transformer.wte.weight") {
        NamedTensor head = t;
        head.name = "lm_head.weight";
        head.data[0] += 1.0f;
        c.tensors.push_back(head);
        return;
      }
    }
  });
  ExpectCleanFailure(Run({"eval", "--weights", untied, "--data", val_bin_}),
                     {"untied.safetensors", "lm_head.weight differs from transformer.wte.weight"});
  const std::string odd = EditedWeights("odd.safetensors", [](SafetensorsContents& c) {
    c.tensors.push_back(NamedTensor{"lm_head.weight", {3}, {1, 2, 3}});
  });
  ExpectCleanFailure(Run({"sample", "--weights", odd}), {"odd.safetensors", "lm_head.weight has shape [3]"});
}

TEST_F(BadInput, AbsurdSizesAreRefusedUpFront) {
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--threads", "100000"}), {"'threads'", "100000"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--grad_accum_steps", "2147483647"}),
                     {"'grad_accum_steps'", "2147483647"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--max_steps", "-5"}), {"'max_steps'"});
}

TEST_F(BadInput, FifosAreRefusedWithoutBlocking) {
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0) << std::strerror(errno);
  const std::string fifo = Path("fifo");
  // Each of these blocked forever reading the pipe.
  ExpectCleanFailure(Train({"--train_data", train_bin_}, fifo), {fifo, "FIFO"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--train", fifo}), {fifo, "FIFO"});
  ExpectCleanFailure(Train({"--train_data", fifo}), {fifo, "FIFO"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--val_data", fifo}), {fifo, "FIFO"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--init_from", fifo}), {fifo, "FIFO"});
  ExpectCleanFailure(Run({"eval", "--weights", fifo, "--data", val_bin_}), {fifo, "FIFO"});
  ExpectCleanFailure(Run({"sample", "--weights", fifo}), {fifo, "FIFO"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--metrics_addr", "127.0.0.1:0", "--metrics_token_file", fifo}),
                     {"metrics_token_file", fifo, "FIFO"});
  ExpectCleanFailure(Run({"prepare", "--input", fifo, "--out-dir", Path("prepared")}), {fifo, "FIFO"});
  EXPECT_FALSE(fs::exists(Path("prepared/train.bin")));
  // GPT-2 tokenizer files that are a FIFO or a directory are named as such, not as missing.
  fs::create_directories(Path("tk/vocab.bpe"));
  ASSERT_EQ(::mkfifo(Path("tk/encoder.json").c_str(), 0600), 0) << std::strerror(errno);
  Write("text.txt", "some text to tokenize\n");
  ExpectCleanFailure(Run({"prepare", "--input", Path("text.txt"), "--out-dir", Path("p2"), "--tokenizer", "gpt2",
                          "--tokenizer-dir", Path("tk")}),
                     {"encoder.json", "not a regular file"});
}

TEST_F(BadInput, OutputsThatAreFifosAreRefusedWithoutBlocking) {
  // A FIFO where the run appends metrics.jsonl blocked before step 1 and ignored SIGTERM.
  fs::create_directories(Path("fifo_out"));
  ASSERT_EQ(::mkfifo(Path("fifo_out/metrics.jsonl").c_str(), 0600), 0) << std::strerror(errno);
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--out_dir", Path("fifo_out")}),
                     {"metrics.jsonl", "FIFO"});
}

TEST_F(BadInput, SigtermEndsACommandOtherThanTrainAtOnce) {
  // An S3 endpoint that accepts connections and never answers: `checkpoint list` waits on it, and
  // SIGTERM must end it (it used to set a stop flag only training polls).
  testing_util::Listener silent;
  ::setenv("AWS_ENDPOINT_URL", fmt::format("http://127.0.0.1:{}", silent.port).c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", "k", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "s", 1);
  ::setenv("AWS_REGION", "us-east-1", 1);
  const pid_t pid = cli_testing::Spawn(Path(""), {"checkpoint", "list", "s3://bucket/p"});
  for (const char* v : {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}) ::unsetenv(v);
  ASSERT_GT(pid, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const int rc = cli_testing::WaitExit(pid, std::chrono::seconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "exit " << rc;
}

TEST_F(BadInput, UrlShapedOutputsAreRefusedNotMadeLocalDirectories) {
  for (const std::string url : {"s3:/bucket/p", "S3://bucket/p", "http:/x"}) {
    ExpectCleanFailure(Train({"--train_data", train_bin_, "--checkpoint_dir", url}), {url});
  }
  for (const std::string url : {"s3://bucket/o", "S3://bucket/o"}) {
    ExpectCleanFailure(Train({"--train_data", train_bin_, "--out_dir", url}), {url, "looks like a URL"});
  }
  ExpectCleanFailure(Run({"prepare", "--input", train_bin_, "--out-dir", "s3://bucket/d"}), {"looks like a URL"});
  EXPECT_FALSE(fs::exists(Path("s3:")));
  EXPECT_FALSE(fs::exists(Path("S3:")));
  EXPECT_FALSE(fs::exists(Path("http:")));
}

TEST_F(BadInput, EmptyInitFromIsRefusedNotRandomWeights) {
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--init-from", ""}), {"--init-from is empty"});
  // The other spelling is the same flag.
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--init_from", ""}), {"--init-from is empty"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--init_from="}), {"--init-from"});
  EXPECT_FALSE(fs::exists(Path("out/model.safetensors")));
}

TEST_F(BadInput, TokenFileWithDamagedMagicIsNotReadAsBareTokens) {
  // With a large vocabulary every uint16 is a valid token, so the header's ints were taken as text.
  std::string bytes = ReadAll(train_bin_);
  bytes[0] ^= 0x5a;
  Write("damaged.bin", bytes);
  ExpectCleanFailure(Train({"--train_data", Path("damaged.bin"), "--vocab_size", "50257"}),
                     {"damaged.bin", "magic", "damaged"});
}

TEST_F(BadInput, SafetensorsHeaderWithNulIsRefused) {
  std::string bytes = ReadAll(GoodWeights());
  const size_t at = bytes.find("__metadata__");
  ASSERT_NE(at, std::string::npos);
  bytes[at + 2] = '\0';  // the old reader stopped here and parsed the prefix
  Write("nul.safetensors", bytes);
  ExpectCleanFailure(Run({"eval", "--weights", Path("nul.safetensors"), "--data", val_bin_}), {"nul.safetensors", "NUL"});
}

TEST_F(BadInput, NumbersBeyondADoubleAreNamedWithTheirFileAndKey) {
  // A raw "[json.exception.out_of_range.406]" with exit code 1 and no file named.
  Write("big_train.json", "{\"lr\": 1e400}");
  RunResult r = Train({"--train_data", train_bin_, "--train", Path("big_train.json")});
  ExpectCleanFailure(r, {"big_train.json", "key 'lr'", "1e400"});
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r;
  auto model = nlohmann::json::parse(ReadAll(kByteTiny));
  std::string text = model.dump();
  text.insert(text.size() - 1, ", \"_note\": [1, -2e999]");
  Write("big_model.json", text);
  ExpectCleanFailure(Train({"--train_data", train_bin_}, Path("big_model.json")), {"big_model.json", "-2e999"});
}

TEST_F(BadInput, RandomBytesAreNotASafetensorsFile) {
  // Bytes that are no JSON at all were reported as "nested more than 64 levels deep".
  std::string bytes(8 + 300, '\0');
  bytes[0] = static_cast<char>(300 % 256);
  bytes[1] = static_cast<char>(300 / 256);
  uint64_t x = 7;
  for (size_t i = 8; i < bytes.size(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    bytes[i] = i % 2 == 0 ? '[' : static_cast<char>(x >> 56);
  }
  bytes[8] = static_cast<char>(0x93);
  Write("random.safetensors", bytes);
  const RunResult r = Run({"eval", "--weights", Path("random.safetensors"), "--data", val_bin_});
  ExpectCleanFailure(r, {"random.safetensors", "not a safetensors file"});
  EXPECT_EQ(r.err.find("nested"), std::string::npos) << r;
}

TEST_F(BadInput, SampleFlagsOutOfRange) {
  const std::string w = GoodWeights();
  ExpectCleanFailure(Run({"sample", "--weights", w, "--temperature", "inf"}), {"--temperature", "inf"});
  ExpectCleanFailure(Run({"sample", "--weights", w, "--temperature", "nan"}), {"--temperature"});
  RunResult r = Run({"sample", "--weights", w, "--seed", "-1"});
  ExpectCleanFailure(r, {"--seed", "'-1'"});
  r = Run({"sample", "--weights", w, "--tokens", "abc"});
  ExpectCleanFailure(r, {"--tokens", "abc"});
  EXPECT_LT(r.err.size(), 300u) << r;  // no 300-digit range
  r = Run({"eval", "--weights", w, "--data", val_bin_, "--batches", "0"});
  ExpectCleanFailure(r, {"--batches"});
  EXPECT_LT(r.err.size(), 300u) << r;
  ExpectCleanFailure(Run({"export", "--init", "--model", kByteTiny, "--seed", "-1", "--out", Path("e")}), {"--seed"});
}

TEST_F(BadInput, MessagesNameTheRealProblem) {
  // A directory as --model named the stream error, not the path.
  ExpectCleanFailure(Train({"--train_data", train_bin_}, dir_.string()), {dir_.string(), "is a directory"});
  ExpectCleanFailure(Run({"eval", "--weights", dir_.string(), "--data", val_bin_}), {dir_.string(), "is a directory"});
  ExpectCleanFailure(Train({"--train_data", train_bin_, "--metrics_addr", "127.0.0.1:0", "--metrics_token_file",
                            dir_.string()}),
                     {"metrics_token_file", dir_.string(), "is a directory"});
  // A flag missing its value blamed the next flag's value.
  RunResult r = Train({"--train_data", train_bin_, "--max_steps", "--lr", "1e-3"});
  ExpectCleanFailure(r, {"--max_steps has no value", "--lr"});
  // An unknown command said "A subcommand is required".
  r = Run({"frobnicate"});
  ExpectCleanFailure(r, {"unknown command 'frobnicate'"});
}

}  // namespace
}  // namespace tf
