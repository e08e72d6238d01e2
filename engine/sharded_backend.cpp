#include "engine/sharded_backend.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/aligned_buffer.h"
#include "base/format.h"
#include "comm/grad_sync.h"
#include "engine/optimizer.h"
#include "model/gpt2.h"
#include "model/parameters.h"

namespace tf {
namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// Collectives run by one thread in the order queued — the same order on every rank, since every
// rank's model makes the same calls. Wait(ticket) returns once that one (and every earlier one) ran,
// with the first error of any.
class CommThread {
 public:
  CommThread() : thread_([this] { Main(); }) {}
  ~CommThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  int64_t Push(std::function<Status()> op) {
    int64_t ticket;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(op));
      ticket = ++pushed_;
    }
    cv_.notify_all();
    return ticket;
  }
  Status Wait(int64_t ticket) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= ticket; });
    return error_;
  }
  Status Drain() {
    int64_t last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = pushed_;
    }
    return Wait(last);
  }

 private:
  void Main() {
    omp_set_num_threads(1);  // the compute thread's team has the cores
    while (true) {
      std::function<Status()> op;
      bool failed;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        op = std::move(queue_.front());
        queue_.pop_front();
        failed = !error_.ok();
      }
      Status s = failed ? Status::OK() : op();  // after an error, drain without talking
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!s.ok() && error_.ok()) error_ = std::move(s);
        ++done_;
      }
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<Status()>> queue_;
  int64_t pushed_ = 0, done_ = 0;
  Status error_;
  bool stop_ = false;
  std::thread thread_;
};

class ShardedCpuBackend;

// The trainer's view of a stage 2/3 reduction: the backend reduce-scatters as backward goes;
// Finish waits for it and averages the shard.
class ShardSync final : public comm::StatelessGradientSync {
 public:
  explicit ShardSync(ShardedCpuBackend* backend) : backend_(backend) {}
  void BeginStep(int64_t) override;
  void MarkReady(int64_t begin, int64_t end) override;
  Status Finish() override;
  StatusOr<comm::ReducerStats> LastStats() override;
  const std::vector<comm::Bucket>& buckets() const override { return buckets_; }
  const comm::ReducerOptions& options() const override { return options_; }

 private:
  ShardedCpuBackend* backend_;
  std::vector<comm::Bucket> buckets_;
  comm::ReducerOptions options_;
};

class ShardedCpuBackend final : public TrainBackend, private UnitStorage {
 public:
  ShardedCpuBackend(int stage, const comm::ShardPlan& plan, std::unique_ptr<comm::Communicator> group,
                    std::unique_ptr<comm::Communicator> across)
      : stage_(stage), plan_(plan), comm_(std::move(group)), across_(std::move(across)), me_(comm_->rank()),
        world_(comm_->world() * across_->world()), b_(plan.begin(me_)), e_(plan.end(me_)) {}

  Status Init(const GPT2Config& config, const TrainConfig& train, const AdamWConfig& adamw) {
    TF_ASSIGN_OR_RETURN(model_, GPT2::Create(config, train.batch_size, train.seq_len, /*external_storage=*/stage_ >= 2));
    const ParameterLayout& layout = model_->layout();
    if (plan_.total != layout.total() || plan_.world != comm_->world()) {
      return Status::Internal("shard plan of {} elements over {} ranks for {} parameters over a group of {} ranks",
                              plan_.total, plan_.world, layout.total(), comm_->world());
    }
    const int units = NumUnits(layout);
    for (int u = 0; u < units; ++u) units_.push_back(UnitRange(layout, u));
    root_[0] = 0;
    root_[1] = units - 1;
    int64_t block = 0;
    for (int u = 0; u < units; ++u) {
      const auto [ub, ue] = units_[static_cast<size_t>(u)];
      if (!IsRoot(u)) block = std::max(block, ue - ub);
    }
    const int64_t S = e_ - b_;
    try {
      optimizer_ = std::make_unique<AdamW>(layout, adamw, b_, e_);
      if (stage_ == 2) params_ = AlignedBuffer(layout.total());
      if (stage_ == 3) shard_params_ = AlignedBuffer(S);
      if (stage_ >= 2) {
        shard_grads_ = AlignedBuffer(S);
        for (int i = 0; i < 2; ++i) {
          const auto [ub, ue] = units_[static_cast<size_t>(root_[i])];
          root_grads_[i].buf = AlignedBuffer(ue - ub);
          block_grads_[i].buf = AlignedBuffer(block);
          if (stage_ == 3) {
            root_params_[i].buf = AlignedBuffer(ue - ub);
            block_params_[i].buf = AlignedBuffer(block);
          }
        }
      }
    } catch (const std::bad_alloc&) {
      return Status::InvalidArgument("out of memory allocating ZeRO stage {} state of rank {} ({} parameters of {})",
                                     stage_, me_, S, layout.total());
    }
    first_.assign(static_cast<size_t>(units), true);
    grad_slot_.assign(static_cast<size_t>(units), nullptr);
    if (stage_ >= 2) model_->set_unit_storage(this);
    comm_thread_ = std::make_unique<CommThread>();
    return Status::OK();
  }

  ~ShardedCpuBackend() override { comm_thread_.reset(); }

  std::string Describe() const override {
    const int n = omp_get_max_threads();
    const std::string group =
        across_->world() == 1 ? ""
                              : fmt::format(" (replica group {} of {}, {} ranks each)", across_->rank(),
                                            across_->world(), comm_->world());
    return fmt::format("cpu ({} thread{}), ZeRO stage {}: elements [{}, {}) of {}{}", n, n == 1 ? "" : "s", stage_, b_,
                       e_, plan_.total, group);
  }
  const ParameterLayout& layout() const override { return model_->layout(); }
  bool collective_state() const override { return true; }
  bool params_collective() const override { return stage_ == 3; }
  int64_t update_wire_bytes() const override { return update_wire_bytes_; }

  Status ZeroGrad() override {
    if (stage_ == 1) model_->ZeroGrad();
    std::fill(first_.begin(), first_.end(), true);
    return Status::OK();
  }
  StatusOr<float> ForwardBackward(const int32_t* inputs, const int32_t* targets, int B, int T,
                                  float grad_scale) override {
    const float loss = model_->ForwardBackward(inputs, targets, B, T, grad_scale);
    TF_RETURN_IF_ERROR(error_);
    return loss;
  }
  StatusOr<float> Forward(const int32_t* inputs, const int32_t* targets, int B, int T) override {
    const float loss = model_->Forward(inputs, targets, B, T);
    TF_RETURN_IF_ERROR(error_);
    return loss;
  }

  StatusOr<float> GradNorm() override {
    const float* g = ShardGrads();
    double mine = cpu::sum_squares(g, static_cast<long>(e_ - b_));
    std::vector<double> parts(static_cast<size_t>(plan_.world));
    TF_RETURN_IF_ERROR(comm_->AllGather(&mine, parts.data(), sizeof(double)));
    double total = 0.0;
    for (double p : parts) total += p;
    norm_ = std::sqrt(total);
    return static_cast<float>(norm_);
  }

  Status ApplyUpdate(double lr, int64_t t) override {
    TF_RETURN_IF_ERROR(comm_thread_->Drain());
    optimizer_->Apply(OwnParams(), ShardGrads(), lr, t, norm_);
    return Publish();
  }

  std::pair<int64_t, std::span<float>> HostParams() override {
    if (stage_ == 3) return {b_, shard_params_.span()};
    return {0, stage_ == 1 ? model_->params() : params_.span()};
  }
  Status GetParams(std::span<float> out) override {
    if (stage_ == 3) return GatherParams(out);
    TF_RETURN_IF_ERROR(CheckWhole(out.size(), "GetParams"));
    std::span<const float> p = stage_ == 1 ? model_->params() : params_.span();
    std::copy(p.begin(), p.end(), out.begin());
    return Status::OK();
  }
  Status SetParams(std::span<const float> in) override {
    TF_RETURN_IF_ERROR(CheckWhole(in.size(), "SetParams"));
    TF_RETURN_IF_ERROR(comm_thread_->Drain());
    if (stage_ == 3) {
      std::copy(in.begin() + b_, in.begin() + e_, shard_params_.data());
      Invalidate();
    } else {
      std::span<float> p = stage_ == 1 ? model_->params() : params_.span();
      std::copy(in.begin(), in.end(), p.begin());
    }
    return Status::OK();
  }
  Status GetOptimizerState(std::span<float> m, std::span<float> v) override {
    TF_RETURN_IF_ERROR(CheckWhole(m.size(), "GetOptimizerState"));
    TF_RETURN_IF_ERROR(CheckWhole(v.size(), "GetOptimizerState"));
    TF_RETURN_IF_ERROR(comm_->AllGatherV(optimizer_->m().data(), m.data(), Sizes(), comm::DataType::kF32));
    return comm_->AllGatherV(optimizer_->v().data(), v.data(), Sizes(), comm::DataType::kF32);
  }
  Status SetOptimizerState(std::span<const float> m, std::span<const float> v) override {
    TF_RETURN_IF_ERROR(CheckWhole(m.size(), "SetOptimizerState"));
    TF_RETURN_IF_ERROR(CheckWhole(v.size(), "SetOptimizerState"));
    std::copy(m.begin() + b_, m.begin() + e_, optimizer_->m().begin());
    std::copy(v.begin() + b_, v.begin() + e_, optimizer_->v().begin());
    return Status::OK();
  }
  Status SetStateSlice(int64_t begin, std::span<const float> params, std::span<const float> m,
                       std::span<const float> v) override {
    const auto n = static_cast<int64_t>(m.size());
    if (begin > b_ || begin + n < e_ || static_cast<int64_t>(v.size()) != n) {
      return Status::InvalidArgument("rank {} owns elements [{}, {}) of the state; it was given [{}, {})", me_, b_, e_,
                                     begin, begin + n);
    }
    if (params.size() == static_cast<size_t>(plan_.total)) {
      TF_RETURN_IF_ERROR(SetParams(params));
    } else if (static_cast<int64_t>(params.size()) == n && stage_ == 3) {
      std::copy_n(params.begin() + (b_ - begin), e_ - b_, shard_params_.data());
      Invalidate();
    } else {
      return Status::InvalidArgument("ZeRO stage {} needs {} parameters, got {}", stage_,
                                     stage_ == 3 ? "its shard's or all" : "all", params.size());
    }
    std::copy_n(m.begin() + (b_ - begin), e_ - b_, optimizer_->m().begin());
    std::copy_n(v.begin() + (b_ - begin), e_ - b_, optimizer_->v().begin());
    return Status::OK();
  }
  Status SnapshotState(int64_t begin, int64_t end, float* params, float* m, float* v) override {
    if (begin == end) return Status::OK();  // a part with no chunks (a rank outside replica group 0)
    if (begin < b_ || begin > end || end > e_) {
      return Status::InvalidArgument("rank {} holds elements [{}, {}) of the state (ZeRO stage {}); a snapshot asked "
                                     "for [{}, {})",
                                     me_, b_, e_, stage_, begin, end);
    }
    const int64_t o = begin - b_, n = end - begin;
    std::copy_n(OwnParams() + o, n, params);
    std::copy_n(optimizer_->m().data() + o, n, m);
    std::copy_n(optimizer_->v().data() + o, n, v);
    return Status::OK();
  }
  comm::GradientBuffer gradient_buffer() override { return comm::GradientBuffer{}; }
  void SetGradReadyHook(GPT2::GradReadyHook hook) override {
    if (stage_ == 1) model_->set_grad_ready_hook(std::move(hook));
  }
  std::unique_ptr<comm::GradientSync> TakeGradientSync() override { return std::make_unique<ShardSync>(this); }

  // ShardSync's side.
  void BeginReduction() { running_ = comm::ReducerStats{}; }
  // Stage 1: backward of the step's last micro-batch made the unit at [begin, end) of the model's
  // gradient final; its reduction goes from there into the shard.
  void RangeReady(int64_t begin, int64_t end) {
    if (stage_ != 1) return;
    const auto it = std::lower_bound(units_.begin(), units_.end(), std::make_pair(begin, end));
    if (it == units_.end() || *it != std::make_pair(begin, end)) {
      Fail(Status::Internal("ZeRO stage 1: grad-ready range [{}, {}) is not a unit", begin, end));
      return;
    }
    Reduce(static_cast<int>(it - units_.begin()), model_->grads().data() + begin, /*first=*/true);
  }
  Status FinishReduction() {
    const auto t0 = Clock::now();
    Status s = comm_thread_->Drain();
    running_.exposed_ms = MsSince(t0);
    if (!s.ok()) return s;
    const float inv = 1.0f / static_cast<float>(world_);
    float* g = ShardGrads();
    const int64_t n = e_ - b_;
    for (int64_t i = 0; i < n; ++i) g[i] *= inv;
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      running_.raw_bytes = plan_.total * 4;
      stats_ = running_;
    }
    return Status::OK();
  }
  comm::ReducerStats LastReductionStats() {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

 private:
  struct Slot {
    AlignedBuffer buf;
    int unit = -1;        // whose parameters it holds (or is being filled with); -1: none
    bool held = false;    // the model is using it
    int64_t ticket = 0;   // the collective that fills (parameters) or empties (gradients) it
    int64_t used = 0;     // when it was last acquired (least recently used goes first)
  };

  bool IsRoot(int unit) const { return unit == root_[0] || unit == root_[1]; }
  int RootIndex(int unit) const { return unit == root_[0] ? 0 : 1; }
  float* ShardGrads() { return stage_ == 1 ? model_->grads().data() + b_ : shard_grads_.data(); }
  float* OwnParams() {
    if (stage_ == 3) return shard_params_.data();
    return (stage_ == 1 ? model_->params().data() : params_.data()) + b_;
  }
  std::vector<int64_t> Sizes() const {
    std::vector<int64_t> s(static_cast<size_t>(plan_.world));
    for (int r = 0; r < plan_.world; ++r) s[static_cast<size_t>(r)] = plan_.size(r);
    return s;
  }
  Status CheckWhole(size_t n, const char* what) const {
    if (static_cast<int64_t>(n) != plan_.total) {
      return Status::InvalidArgument("{}: {} values for {} parameters", what, n, plan_.total);
    }
    return Status::OK();
  }
  // Stage 3's GetParams: unit by unit, so a rank that only takes part (an empty `out`) holds one
  // unit at a time, never the whole model.
  Status GatherParams(std::span<float> out) {
    if (!out.empty()) TF_RETURN_IF_ERROR(CheckWhole(out.size(), "GetParams"));
    TF_RETURN_IF_ERROR(comm_thread_->Drain());
    std::vector<float> unit;
    if (out.empty()) {
      int64_t most = 0;
      for (const auto& [ub, ue] : units_) most = std::max(most, ue - ub);
      try {
        unit.resize(static_cast<size_t>(most));
      } catch (const std::bad_alloc&) {
        return Status::InvalidArgument("out of memory for a unit of {} parameters to gather", most);
      }
    }
    for (const auto& [ub, ue] : units_) {
      const float* src = shard_params_.data() + (std::clamp(ub, b_, e_) - b_);
      float* dst = out.empty() ? unit.data() : out.data() + ub;
      TF_RETURN_IF_ERROR(comm_->AllGatherV(src, dst, plan_.Counts(ub, ue), comm::DataType::kF32));
    }
    return Status::OK();
  }
  // After the shard changed: stages 1 and 2 all-gather the parameters; stage 3 forgets what it gathered.
  Status Publish() {
    if (stage_ == 3) {
      Invalidate();
      return Status::OK();
    }
    float* p = stage_ == 1 ? model_->params().data() : params_.data();
    update_wire_bytes_ = (e_ - b_) * 4 * (plan_.world - 1);
    return comm_->AllGatherV(p + b_, p, Sizes(), comm::DataType::kF32);
  }
  void Invalidate() {
    for (Slot& s : root_params_) s.unit = -1;
    for (Slot& s : block_params_) s.unit = -1;
  }
  void Fail(Status s) {
    if (error_.ok()) error_ = std::move(s);
  }

  // Queues the all-gather of unit u's parameters into `slot`.
  void Gather(int u, Slot& slot) {
    const auto [ub, ue] = units_[static_cast<size_t>(u)];
    const int64_t lo = std::clamp(ub, b_, e_);
    slot.unit = u;
    float* dst = slot.buf.data();
    const float* src = shard_params_.data() + (lo - b_);
    slot.ticket = comm_thread_->Push([this, ub, ue, src, dst] {
      const auto t0 = Clock::now();
      Status s = comm_->AllGatherV(src, dst, plan_.Counts(ub, ue), comm::DataType::kF32);
      Account(MsSince(t0), Mine(ub, ue) * 4 * (plan_.world - 1));
      return s;
    });
  }
  int64_t MaxPiece() const {
    int64_t most = 0;
    for (const auto& [ub, ue] : units_) most = std::max(most, Mine(ub, ue));
    return most;
  }
  int64_t Mine(int64_t ub, int64_t ue) const { return std::max<int64_t>(0, std::min(ue, e_) - std::max(ub, b_)); }
  void Account(double ms, int64_t sent) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    running_.comm_ms += ms;
    running_.wire_bytes += std::max<int64_t>(0, sent);
  }
  Slot* BlockSlotHolding(int u) {
    for (Slot& s : block_params_) {
      if (s.unit == u) return &s;
    }
    return nullptr;
  }
  // A block slot the model does not hold: an empty one first, else the least recently used.
  Slot* FreeBlockSlot() {
    Slot* best = nullptr;
    for (Slot& s : block_params_) {
      if (s.held) continue;
      if (best == nullptr || (s.unit == -1 && best->unit != -1) ||
          ((s.unit == -1) == (best->unit == -1) && s.used < best->used)) {
        best = &s;
      }
    }
    return best;
  }

  // UnitStorage (stages 2 and 3).
  float* AcquireParams(int u) override {
    const int64_t ub = units_[static_cast<size_t>(u)].first;
    if (stage_ == 2) return params_.data() + ub;
    Slot* slot = IsRoot(u) ? &root_params_[RootIndex(u)] : BlockSlotHolding(u);
    if (slot == nullptr) slot = FreeBlockSlot();
    if (slot == nullptr) {  // the model holds more blocks than the slots: a broken call order
      Fail(Status::Internal("ZeRO stage 3: no free parameter slot for unit {}", u));
      return block_params_[0].buf.data();
    }
    if (slot->unit != u) Gather(u, *slot);
    if (Status s = comm_thread_->Wait(slot->ticket); !s.ok()) Fail(std::move(s));
    slot->held = true;
    slot->used = ++clock_;
    return slot->buf.data();
  }
  void ReleaseParams(int u) override {
    if (stage_ != 3) return;
    Slot* slot = IsRoot(u) ? &root_params_[RootIndex(u)] : BlockSlotHolding(u);
    if (slot != nullptr) slot->held = false;
  }
  void Prefetch(int u) override {
    if (stage_ != 3 || u < 0 || u >= static_cast<int>(units_.size())) return;
    if (IsRoot(u)) {
      Slot& slot = root_params_[RootIndex(u)];
      if (slot.unit != u && !slot.held) Gather(u, slot);
      return;
    }
    if (BlockSlotHolding(u) != nullptr) return;
    if (Slot* slot = FreeBlockSlot(); slot != nullptr) Gather(u, *slot);
  }
  float* AcquireGrads(int u) override {
    Slot& slot = IsRoot(u) ? root_grads_[RootIndex(u)] : block_grads_[next_grads_++ % 2];
    if (Status s = comm_thread_->Wait(slot.ticket); !s.ok()) Fail(std::move(s));  // its last reduction is done
    const auto [ub, ue] = units_[static_cast<size_t>(u)];
    std::memset(slot.buf.data(), 0, static_cast<size_t>(ue - ub) * sizeof(float));
    grad_slot_[static_cast<size_t>(u)] = &slot;
    return slot.buf.data();
  }
  void GradsDone(int u) override {
    Slot& slot = *grad_slot_[static_cast<size_t>(u)];
    const bool first = first_[static_cast<size_t>(u)];
    first_[static_cast<size_t>(u)] = false;
    slot.ticket = Reduce(u, slot.buf.data(), first);
  }

  // Queues the reduction of unit u's gradient `src` (the unit's size) into this rank's shard:
  // reduce-scattered within the group (rank order), then each shard piece summed across the groups
  // (comm/communicator.h AllReduceSumIdentical: every group gets the same bits). The first
  // micro-batch's sum goes straight into the shard (stage 0's bits without groups); later ones add.
  int64_t Reduce(int u, const float* src, bool first) {
    const auto [ub, ue] = units_[static_cast<size_t>(u)];
    const int64_t lo = std::clamp(ub, b_, e_), n = Mine(ub, ue);
    float* shard = ShardGrads() + (lo - b_);
    return comm_thread_->Push([this, ub, ue, n, first, src, shard] {
      const auto t0 = Clock::now();
      if (!first && scratch_.size() < n) scratch_ = AlignedBuffer(MaxPiece());  // accumulation only
      float* recv = first ? shard : scratch_.data();
      TF_RETURN_IF_ERROR(comm_->ReduceScatterSum(src, recv, plan_.Counts(ub, ue), comm::DataType::kF32));
      TF_ASSIGN_OR_RETURN(const int64_t across, comm::AllReduceSumIdentical(*across_, recv, n, &across_scratch_));
      if (!first) {
        for (int64_t i = 0; i < n; ++i) shard[i] += recv[i];
      }
      Account(MsSince(t0), (ue - ub - n) * 4 + across);
      return Status::OK();
    });
  }

  const int stage_;
  const comm::ShardPlan plan_;
  std::unique_ptr<comm::Communicator> comm_;    // this rank's replica group (all ranks without groups)
  std::unique_ptr<comm::Communicator> across_;  // the ranks of the other groups with this rank's index
  const int me_;      // this rank's index in its group: its plan rank
  const int world_;   // all ranks: the gradient is their average
  const int64_t b_, e_;  // this rank's shard
  std::unique_ptr<GPT2> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::vector<std::pair<int64_t, int64_t>> units_;
  std::array<int, 2> root_ = {0, 0};  // wte+wpe and ln_f: gathered once per step at stage 3
  AlignedBuffer params_;        // stage 2: the whole parameters
  AlignedBuffer shard_params_;  // stage 3: this rank's shard of them
  AlignedBuffer shard_grads_;   // stages 2, 3: the reduced gradient of the shard
  AlignedBuffer scratch_;       // the communication thread's: a later micro-batch's piece (accumulation)
  std::vector<float> across_scratch_;  // the communication thread's: the sum across the groups
  std::array<Slot, 2> root_params_, block_params_, root_grads_, block_grads_;
  std::vector<bool> first_;       // per unit: no micro-batch reduced yet this step
  std::vector<Slot*> grad_slot_;  // per unit: the slot its gradient is in
  int64_t next_grads_ = 0, clock_ = 0;
  std::unique_ptr<CommThread> comm_thread_;
  Status error_;  // a collective under the model's calls failed (reported after the pass)
  double norm_ = 0;
  int64_t update_wire_bytes_ = 0;
  std::mutex stats_mu_;
  comm::ReducerStats running_, stats_;
};

void ShardSync::BeginStep(int64_t) { backend_->BeginReduction(); }
void ShardSync::MarkReady(int64_t begin, int64_t end) { backend_->RangeReady(begin, end); }
Status ShardSync::Finish() { return backend_->FinishReduction(); }
StatusOr<comm::ReducerStats> ShardSync::LastStats() { return backend_->LastReductionStats(); }

}  // namespace

comm::ShardPlan TrainShardPlan(const GPT2Config& model, const TrainConfig& train, int world) {
  const auto chunk = static_cast<int64_t>(train.checkpoint_chunk_mb * (1 << 20) / 4);
  return comm::ShardPlan::Make(ParameterLayout(model).total(), world, std::max<int64_t>(16, chunk));
}

double PlannedSumSquares(const float* grads, const comm::ShardPlan& plan) {
  double total = 0.0;
  for (int r = 0; r < plan.world; ++r) total += cpu::sum_squares(grads + plan.begin(r), static_cast<long>(plan.size(r)));
  return total;
}

StatusOr<std::unique_ptr<TrainBackend>> MakeShardedCpuBackend(const GPT2Config& model, const TrainConfig& train,
                                                              const AdamWConfig& adamw, const comm::ShardPlan& plan,
                                                              std::unique_ptr<comm::Communicator> group,
                                                              std::unique_ptr<comm::Communicator> across) {
  if (train.zero_stage < 1 || train.zero_stage > 3) {
    return Status::InvalidArgument("zero_stage {}: the sharded backend runs stages 1 to 3", train.zero_stage);
  }
  if (group == nullptr || across == nullptr) return Status::Internal("the sharded backend needs two communicators");
  auto backend = std::make_unique<ShardedCpuBackend>(train.zero_stage, plan, std::move(group), std::move(across));
  TF_RETURN_IF_ERROR(backend->Init(model, train, adamw));
  return std::unique_ptr<TrainBackend>(std::move(backend));
}

}  // namespace tf
