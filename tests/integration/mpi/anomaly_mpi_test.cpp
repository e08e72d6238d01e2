// Anomaly guards across ranks (mpirun -np 2 and 3): a NaN loss on one rank only reaches every rank
// through the loss average, so all ranks take the same action at the same step and their weights
// stay identical — skipping the update, or rolling back to the shared checkpoint. With the monitor
// on, every step also carries each rank's busy time to the others.
#include <mpi.h>

#include <cstring>

#include "tests/integration/mpi/data_parallel_fixture.h"

namespace tf::test {
namespace {

using AnomalyMpiTest = DataParallelFixture;

// Every rank's parameters are bit-identical to rank 0's.
void ExpectSameWeightsOnAllRanks(Trainer& t) {
  std::vector<float> p(static_cast<size_t>(t.backend().layout().total()));
  ASSERT_TRUE(t.backend().GetParams(p).ok());
  std::vector<float> zero(p);
  MPI_Bcast(zero.data(), static_cast<int>(zero.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  EXPECT_EQ(std::memcmp(p.data(), zero.data(), p.size() * sizeof(float)), 0)
      << "rank " << t.topology().rank << " differs from rank 0";
}

// Records what each step's observers see of the ranks' busy times.
class BusyTimes final : public StepObserver {
 public:
  explicit BusyTimes(std::vector<size_t>* sizes) : sizes_(sizes) {}
  Status OnStep(Trainer&, StepStats& s) override {
    sizes_->push_back(s.rank_busy_ms.size());
    for (double ms : s.rank_busy_ms) EXPECT_GT(ms, 0.0);
    return Status::OK();
  }

 private:
  std::vector<size_t>* sizes_;
};

TEST_F(AnomalyMpiTest, NanOnOneRankIsSkippedByAllAndRankTimesAreGathered) {
  TrainConfig t = Config(2, 1, false);
  t.anomaly_nonfinite = "skip";
  t.metrics_addr = "127.0.0.1:0";
  Trainer::Options o{.print_progress = false, .write_outputs = false};
  if (topo_.rank == topo_.world - 1) o.inject_nan_loss_at_step = 4;
  auto trainer = Trainer::Create(model_, t, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  std::vector<size_t> busy_sizes;
  (*trainer)->AddObserver(std::make_unique<BusyTimes>(&busy_sizes));
  auto r = (*trainer)->Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->steps.size(), 12u);
  for (const StepStats& s : r->steps) {
    EXPECT_EQ(s.update_skipped, s.step == 4) << "rank " << topo_.rank << " step " << s.step;
    EXPECT_TRUE(s.rank_busy_ms.empty()) << "the result keeps per-rank vectors";
  }
  // Rank 0 alone gets every rank's busy time, every step.
  ASSERT_EQ(busy_sizes.size(), 12u);
  for (size_t n : busy_sizes) EXPECT_EQ(n, topo_.rank == 0 ? static_cast<size_t>(topo_.world) : 0u);
  ExpectSameWeightsOnAllRanks(**trainer);
}

TEST_F(AnomalyMpiTest, AllRanksRollBackTogether) {
  char dir[512] = {};
  if (topo_.rank == 0) std::snprintf(dir, sizeof(dir), "%s", (fs::path(data_).parent_path() / "ckpt").c_str());
  MPI_Bcast(dir, sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
  TrainConfig t = Config(2, 1, false);
  t.anomaly_nonfinite = "rollback";
  t.checkpoint_dir = dir;
  t.checkpoint_interval = 5;
  t.checkpoint_keep_last = 0;
  t.metrics_addr = "off";
  Trainer::Options o{.print_progress = false, .write_outputs = false};
  if (topo_.rank == 0) o.inject_nan_loss_at_step = 8;
  auto trainer = Trainer::Create(model_, t, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  auto r = (*trainer)->Run();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->final_step, 12);
  EXPECT_EQ((*trainer)->data_offset(), 8 - 5) << "rank " << topo_.rank;
  ASSERT_EQ(r->steps.size(), 12u);
  for (const StepStats& s : r->steps) EXPECT_FALSE(s.anomaly) << "step " << s.step;
  ExpectSameWeightsOnAllRanks(**trainer);
}

}  // namespace
}  // namespace tf::test
