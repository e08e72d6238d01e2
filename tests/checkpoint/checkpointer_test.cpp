// checkpoint/checkpointer.h: the double buffer and writer thread, world-size-independent chunks
// (two ranks write disjoint halves; any reader gets the whole tensors back bit for bit), the
// commit of every rank's part by rank 0, incremental checkpoints (unchanged chunks cost nothing,
// changed ones are XOR deltas against the last full one, restores are bit-exact), retention that
// keeps the bases of kept incremental checkpoints, the busy policy (skip or wait), and failures
// (a full disk) that are counted and logged and leave the earlier checkpoints intact.
#include <sched.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "base/fault_env.h"
#include "checkpoint/checkpointer.h"
#include "tests/test_dir.h"

namespace tf::checkpoint {
namespace {

std::vector<float> Randn(size_t n, uint32_t seed, float scale = 0.02f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

bool BitEqual(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// Fills every slot of a snapshot from the full tensors in `values` (by tensor name).
void Fill(Checkpointer::Snapshot* s, const std::map<std::string, std::vector<float>>& values) {
  for (const Checkpointer::Slot& slot : s->slots) {
    const std::vector<float>& v = values.at(slot.tensor->name);
    std::copy(v.begin() + slot.begin, v.begin() + slot.end, slot.data.begin());
  }
}

class CheckpointerTest : public ::testing::Test {
 protected:
  std::unique_ptr<ObjectStore> Store(Env* env = Env::Default()) {
    auto s = OpenPosixStore(dir_, env);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(*s);
  }
  std::unique_ptr<Checkpointer> Make(std::vector<StateTensor> tensors, CheckpointerOptions o,
                                     Env* env = Env::Default()) {
    auto c = Checkpointer::Create(Store(env), std::move(tensors), std::move(o));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Writes one checkpoint of `values` at `step` with a one-rank checkpointer and waits for it.
  Status Write(Checkpointer& c, int64_t step, const std::map<std::string, std::vector<float>>& values) {
    Checkpointer::Snapshot* s = c.Begin(step);
    if (s == nullptr) return Status::Internal("skipped");
    Fill(s, values);
    c.Submit(s, {{"step", step}});
    return c.Flush();
  }
  std::vector<float> Read(int64_t step, const std::string& name) {
    auto store = Store();
    auto m = ReadManifest(*store, step);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return {};
    const TensorEntry* t = m->FindTensor(name);
    EXPECT_NE(t, nullptr) << name;
    if (t == nullptr) return {};
    std::vector<float> out(static_cast<size_t>(t->elements));
    Status s = ReadTensorRange(*store, *m, name, 0, t->elements, out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }

  testing_util::TestDir tmp_{"tf_ckptr"};
  std::string dir_ = tmp_.path();
};

TEST(OwnedChunksTest, PartitionEveryWorldSize) {
  for (int64_t chunks : {0, 1, 5, 16, 17}) {
    for (int world = 1; world <= 7; ++world) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const auto [first, last] = OwnedChunks(chunks, r, world);
        EXPECT_EQ(first, next);
        EXPECT_LE(last - first, chunks / world + 1);
        EXPECT_GE(last - first, chunks / world);
        next = last;
      }
      EXPECT_EQ(next, chunks);
    }
  }
}

TEST_F(CheckpointerTest, TwoRanksWriteDisjointSlicesAndAnyReaderGetsTheWholeTensors) {
  const int64_t P = 1000;  // 8 chunks of 128 (the last one short)
  const std::map<std::string, std::vector<float>> values = {
      {"params", Randn(P, 1)}, {"adam.m", Randn(P, 2, 1e-3f)}, {"ef.residual.r0", Randn(300, 3)},
      {"ef.residual.r1", Randn(300, 4)}};
  std::vector<StateTensor> tensors = {
      {"params", P, -1}, {"adam.m", P, -1}, {"ef.residual.r0", 300, 0}, {"ef.residual.r1", 300, 1}};
  std::unique_ptr<Checkpointer> ranks[2];
  for (int r = 0; r < 2; ++r) {
    CheckpointerOptions o;
    o.rank = r;
    o.world = 2;
    o.chunk_elements = 128;
    ranks[r] = Make(tensors, o);
    ASSERT_NE(ranks[r], nullptr);
    Checkpointer::Snapshot* s = ranks[r]->Begin(10);
    ASSERT_NE(s, nullptr);
    // Rank r holds the shared tensors' chunks [4r, 4r+4) and its own residual.
    ASSERT_EQ(s->slots.size(), 3u);
    EXPECT_EQ(s->slots[0].begin, r == 0 ? 0 : 512);
    EXPECT_EQ(s->slots[0].end, r == 0 ? 512 : P);
    EXPECT_EQ(s->slots[2].tensor->name, r == 0 ? "ef.residual.r0" : "ef.residual.r1");
    Fill(s, values);
    ranks[r]->Submit(s, {{"who", r}});
  }
  for (auto& c : ranks) ASSERT_TRUE(c->Flush().ok());
  EXPECT_TRUE(ranks[0]->PartFinished(10) && ranks[1]->PartFinished(10));
  EXPECT_FALSE(ListCheckpoints(*Store())->front().manifest.has_value());  // not committed yet
  ASSERT_TRUE(ranks[0]->CommitNow(10).ok()) << ranks[0]->stats().last_error;
  auto m = ReadManifest(*Store(), 10);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->world, 2);
  EXPECT_EQ(m->state, (nlohmann::json{{"who", 0}}));  // rank 0's state
  EXPECT_TRUE(VerifyCheckpoint(*Store(), *m).ok());
  for (const auto& [name, v] : values) EXPECT_TRUE(BitEqual(Read(10, name), v)) << name;
  // A reader of any slice, as a rank of another world size would read.
  std::vector<float> middle(301);
  ASSERT_TRUE(ReadTensorRange(*Store(), *m, "params", 400, 701, middle).ok());
  EXPECT_TRUE(BitEqual(middle, std::span<const float>(values.at("params")).subspan(400, 301)));
  // A missing part is named when committing.
  for (int r = 0; r < 2; ++r) {
    Checkpointer::Snapshot* s = ranks[r]->Begin(20);
    Fill(s, values);
    if (r == 0) ranks[r]->Submit(s, {});
  }
  ASSERT_TRUE(ranks[0]->Flush().ok());
  Status missing = ranks[0]->CommitNow(20);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("rank 1's part is missing"), std::string::npos) << missing.ToString();
  EXPECT_FALSE(ReadManifest(*Store(), 20).ok());
}

// Three ranks and two chunks: the last rank writes none of the shared tensor.
// The scheduling policy of this process's thread named `name` (field 41 of its stat), or -1.
int ThreadPolicy(const std::string& name) {
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (!std::getline(comm, line) || line != name) continue;
    std::ifstream stat(task.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    std::istringstream rest(text.substr(text.rfind(')') + 2));  // fields 3... after "pid (comm) "
    std::string field;
    for (int i = 3; i <= 41 && rest >> field; ++i) {
      if (i == 41) return std::stoi(field);
    }
  }
  return -1;
}

TEST_F(CheckpointerTest, TheWriterRunsAtIdlePriorityWhenAsked) {
  for (bool idle : {false, true}) {
    CheckpointerOptions o;
    o.idle_priority = idle;
    std::unique_ptr<Checkpointer> c = Make({{"params", 100, -1}}, o);
    ASSERT_TRUE(Write(*c, 1, {{"params", Randn(100, 3)}}).ok());  // the writer has started
    EXPECT_EQ(ThreadPolicy(kWriterThreadName), idle ? SCHED_IDLE : SCHED_OTHER) << "idle " << idle;
    EXPECT_TRUE(BitEqual(Read(1, "params"), Randn(100, 3)));
  }
}

TEST_F(CheckpointerTest, FewerChunksThanRanks) {
  const std::vector<float> v = Randn(100, 5);
  std::unique_ptr<Checkpointer> ranks[3];
  for (int r = 0; r < 3; ++r) {
    CheckpointerOptions o;
    o.rank = r;
    o.world = 3;
    o.chunk_elements = 64;
    ranks[r] = Make({{"params", 100, -1}}, o);
    Checkpointer::Snapshot* s = ranks[r]->Begin(1);
    EXPECT_EQ(s->slots[0].end - s->slots[0].begin, r == 0 ? 64 : r == 1 ? 36 : 0);
    Fill(s, {{"params", v}});
    ranks[r]->Submit(s, {});
  }
  for (auto& c : ranks) ASSERT_TRUE(c->Flush().ok());
  ASSERT_TRUE(ranks[0]->CommitNow(1).ok()) << ranks[0]->stats().last_error;
  EXPECT_TRUE(BitEqual(Read(1, "params"), v));
}

TEST_F(CheckpointerTest, IncrementalCheckpointsAreExactSmallAndKeepTheirBase) {
  const int64_t P = 4096;
  std::vector<float> params = Randn(P, 7), moment = Randn(P, 8, 1e-4f);
  std::vector<float> frozen = Randn(1000, 9);
  CheckpointerOptions o;
  o.chunk_elements = 512;
  o.full_every = 3;
  o.keep_last = 1;
  o.writer_threads = 3;  // chunks encoded and put concurrently (the S3 setting)
  auto c = Make({{"params", P, -1}, {"adam.v", P, -1}, {"frozen", 1000, -1}}, o);
  ASSERT_NE(c, nullptr);
  std::mt19937 g(3);
  std::normal_distribution<float> step_noise(0.0f, 1e-5f);
  std::map<int64_t, std::map<std::string, std::vector<float>>> written;
  int64_t full_bytes = 0;
  for (int64_t step = 1; step <= 4; ++step) {
    // Small AdamW-like updates to params (only the first half: the rest is untouched), moments
    // changing everywhere, one tensor frozen.
    for (int64_t i = 0; i < P / 2; ++i) params[static_cast<size_t>(i)] += step_noise(g);
    for (float& v : moment) v = 0.95f * v + 0.05f * std::fabs(step_noise(g)) * 10;
    written[step] = {{"params", params}, {"adam.v", moment}, {"frozen", frozen}};
    ASSERT_TRUE(Write(*c, step, written[step]).ok()) << c->stats().last_error;
    auto m = ReadManifest(*Store(), step);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    const bool full = step == 1 || step == 4;
    EXPECT_EQ(m->kind, full ? kKindFull : kKindIncremental) << step;
    const CheckpointerStats st = c->stats();
    if (step == 1) full_bytes = st.committed_new_bytes;
    if (!full) {
      // Unchanged chunks (the frozen tensor, params' second half) are the base's objects.
      int64_t referenced = 0;
      for (const ObjectEntry& e : m->objects) {
        if (!e.tensor.empty() && StepOfKey(e.key) == 1) ++referenced;
        if (e.encoding == "xor-planes") {
          EXPECT_EQ(StepOfKey(e.base), 1);
        }
      }
      EXPECT_EQ(referenced, 2 + 4) << step;
      EXPECT_LT(st.committed_new_bytes * 3, full_bytes * 2) << "at least 1.5x smaller than the full one";
      EXPECT_EQ(Dependencies(*m), (std::set<int64_t>{1, step}));
    }
    for (const auto& [name, v] : written[step]) EXPECT_TRUE(BitEqual(Read(step, name), v)) << name << step;
    // keep_last 1: the newest, plus the base of kept incremental ones.
    std::vector<int64_t> present;
    auto listed = ListCheckpoints(*Store());
    ASSERT_TRUE(listed.ok());
    for (const Listed& l : *listed) present.push_back(l.step);
    const std::vector<int64_t> expect = step == 1 ? std::vector<int64_t>{1}
                                        : step < 4 ? std::vector<int64_t>{1, step}
                                                   : std::vector<int64_t>{4};
    EXPECT_EQ(present, expect) << step;
  }
}

// An object store whose puts wait for the test to open a gate.
class GatedStore final : public ObjectStore {
 public:
  explicit GatedStore(std::unique_ptr<ObjectStore> base) : base_(std::move(base)) {}
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }
  Status Put(const std::string& key, std::string_view data) override {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return open_; });
    return base_->Put(key, data);
  }
  StatusOr<std::string> Get(const std::string& key) override { return base_->Get(key); }
  StatusOr<std::vector<std::string>> List(const std::string& prefix) override { return base_->List(prefix); }
  Status Delete(const std::string& key) override { return base_->Delete(key); }
  const std::string& location() const override { return base_->location(); }

 private:
  std::unique_ptr<ObjectStore> base_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST_F(CheckpointerTest, ADueCheckpointWhileBothHalvesAreBusyIsSkippedOrWaitsForOne) {
  for (const bool wait : {false, true}) {
    SCOPED_TRACE(wait ? "wait" : "skip");
    auto gated = std::make_unique<GatedStore>(Store());
    GatedStore* gate = gated.get();
    CheckpointerOptions o;
    o.wait_when_busy = wait;
    o.chunk_elements = 64;
    auto c = Checkpointer::Create(std::move(gated), {{"params", 100, -1}}, o);
    ASSERT_TRUE(c.ok());
    const std::map<std::string, std::vector<float>> v = {{"params", Randn(100, 1)}};
    for (int64_t step : {1, 2}) {
      Checkpointer::Snapshot* s = (*c)->Begin(step);
      ASSERT_NE(s, nullptr);
      Fill(s, v);
      (*c)->Submit(s, {});
    }
    EXPECT_TRUE((*c)->busy());
    if (!wait) {
      EXPECT_EQ((*c)->Begin(3), nullptr);
      EXPECT_EQ((*c)->stats().skipped, 1);
      gate->Open();
    } else {
      std::thread opener([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        gate->Open();
      });
      Checkpointer::Snapshot* s = (*c)->Begin(3);  // blocks until the writer frees a half
      opener.join();
      ASSERT_NE(s, nullptr);
      Fill(s, v);
      (*c)->Submit(s, {});
      EXPECT_EQ((*c)->stats().waited, 1);
      EXPECT_GT((*c)->stats().wait_s, 0.0);
    }
    ASSERT_TRUE((*c)->Flush().ok());
    EXPECT_EQ((*c)->stats().written, wait ? 3 : 2);
    std::filesystem::remove_all(dir_);
  }
}

TEST_F(CheckpointerTest, AFullDiskFailsTheCheckpointNotTrainingAndKeepsTheEarlierOnes) {
  FaultInjectionEnv env(Env::Default());
  CheckpointerOptions o;
  o.chunk_elements = 256;
  o.compress = false;  // raw chunks: sizes known in advance
  o.keep_last = 5;
  auto c = Make({{"params", 1024, -1}}, o, &env);
  ASSERT_NE(c, nullptr);
  const std::map<std::string, std::vector<float>> a = {{"params", Randn(1024, 1)}};
  const std::map<std::string, std::vector<float>> b = {{"params", Randn(1024, 2)}};
  ASSERT_TRUE(Write(*c, 1, a).ok());
  FaultOptions full;
  full.enospc_after_bytes = 2000;  // mid-way through the second chunk of step 2
  env.Reset(full);
  Status s = Write(*c, 2, b);
  EXPECT_FALSE(s.ok());
  const CheckpointerStats st = c->stats();
  EXPECT_EQ(st.failed, 1);
  EXPECT_NE(st.last_error.find("No space left"), std::string::npos) << st.last_error;
  auto listed = ListCheckpoints(*Store());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_TRUE(listed->at(0).manifest.has_value());
  EXPECT_FALSE(listed->at(1).manifest.has_value());  // step 2 does not exist
  EXPECT_TRUE(BitEqual(Read(1, "params"), a.at("params")));
  auto newest = NewestValidCheckpoint(*Store(), nullptr);
  ASSERT_TRUE(newest.ok());
  EXPECT_EQ(newest->step, 1);
  // Space again: the next checkpoint is written, and the failed one's leftovers are pruned.
  env.Reset({});
  ASSERT_TRUE(Write(*c, 3, b).ok());
  EXPECT_TRUE(BitEqual(Read(3, "params"), b.at("params")));
  std::vector<int64_t> present;
  listed = ListCheckpoints(*Store());
  ASSERT_TRUE(listed.ok());
  for (const Listed& l : *listed) present.push_back(l.step);
  EXPECT_EQ(present, (std::vector<int64_t>{1, 3}));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/step-000000000002"));
}

}  // namespace
}  // namespace tf::checkpoint
