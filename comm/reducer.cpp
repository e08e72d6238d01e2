#include "comm/reducer.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include <fmt/format.h>

#include "base/progress.h"

namespace tf::comm {
namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

uint64_t Mix(uint64_t x) { return MixSeed(x); }

}  // namespace

uint64_t MixSeed(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

Status CheckTiles(const std::vector<std::pair<int64_t, int64_t>>& ready_order, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> sorted = ready_order;
  std::sort(sorted.begin(), sorted.end());
  int64_t expect = 0;
  for (auto [b, e] : sorted) {
    if (b != expect || e <= b) {
      return Status::InvalidArgument("gradient reducer: ready ranges do not tile the gradient buffer (gap or overlap "
                                     "at element {})",
                                     expect);
    }
    expect = e;
  }
  if (expect != n) {
    return Status::InvalidArgument("gradient reducer: ready ranges cover {} of {} gradient elements", expect, n);
  }
  return Status::OK();
}

std::pair<int64_t, int64_t> ShardOf(const Bucket& b, int r, int W, const CodecConfig& codec) {
  int64_t align = 16;  // 64-byte lines
  if (codec.kind == CodecKind::kInt8 || codec.kind == CodecKind::kSign) align = std::max<int64_t>(align, codec.block);
  const int64_t len = RoundUp((b.size() + W - 1) / W, align);
  const int64_t s = std::min(b.end, b.begin + len * r);
  const int64_t e = std::min(b.end, s + len);
  return {s, e};
}

std::vector<Bucket> PlanBuckets(const std::vector<std::pair<int64_t, int64_t>>& ready_order, int64_t bucket_bytes,
                                int64_t first_bucket_bytes) {
  const int64_t cap = std::max<int64_t>(1, bucket_bytes / 4);
  const int64_t first_cap = std::max<int64_t>(1, std::min(bucket_bytes, first_bucket_bytes) / 4);
  std::vector<Bucket> out;
  bool open = false;
  Bucket cur;
  auto limit = [&] { return out.empty() ? first_cap : cap; };
  auto close = [&] {
    if (open) out.push_back(cur);
    open = false;
  };
  for (auto [begin, end] : ready_order) {
    // Ranges larger than a bucket are split into bucket-sized pieces, last piece first (the
    // order in which a backward pass writes them does not matter: the range is final at once).
    while (end > begin) {
      const bool adjacent = open && (cur.begin == end || cur.end == begin);
      if (!adjacent) close();
      if (!open) {
        const int64_t n = std::min(end - begin, limit());
        cur = {end - n, end};
        open = true;
        end -= n;
        continue;
      }
      const int64_t room = limit() - cur.size();
      if (room <= 0) {
        close();
        continue;
      }
      const int64_t n = std::min(end - begin, room);
      if (cur.begin == end) {
        cur.begin = end - n;
        end -= n;
      } else {  // cur.end == begin: an ascending range order
        cur.end = begin + n;
        begin += n;
      }
    }
  }
  close();
  return out;
}

GradientReducer::GradientReducer(Communicator* comm, std::span<float> grads, const ReducerOptions& options)
    : comm_(comm), grads_(grads), options_(options) {}

StatusOr<std::unique_ptr<GradientReducer>> GradientReducer::Create(
    Communicator* comm, std::span<float> grads, const std::vector<std::pair<int64_t, int64_t>>& ready_order,
    const ReducerOptions& options) {
  if (comm == nullptr) return Status::InvalidArgument("gradient reducer: no communicator");
  if (options.bucket_bytes < 4 || options.first_bucket_bytes < 4) {
    return Status::InvalidArgument("gradient reducer: bucket sizes must be at least 4 bytes (got {} and {})",
                                   options.bucket_bytes, options.first_bucket_bytes);
  }
  TF_RETURN_IF_ERROR(CheckTiles(ready_order, static_cast<int64_t>(grads.size())));
  std::unique_ptr<GradientReducer> r(new GradientReducer(comm, grads, options));
  r->buckets_ = PlanBuckets(ready_order, options.bucket_bytes, options.first_bucket_bytes);
  const int W = comm->world();
  int64_t max_bucket = 0;
  for (const Bucket& b : r->buckets_) max_bucket = std::max(max_bucket, b.size());
  try {
    if (options.codec.lossy() && options.error_feedback) {
      r->residual_ = AlignedBuffer(static_cast<int64_t>(grads.size()));
      if (!options.codec.sparse()) r->server_residual_ = AlignedBuffer(static_cast<int64_t>(grads.size()));
    }
    // Scratch sized for the largest bucket under the chosen algorithm.
    size_t send = 0, recv = 0;
    int64_t shard = 0;
    for (const Bucket& b : r->buckets_) {
      if (options.codec.kind == CodecKind::kNone) {
        for (int k = 0; k < W; ++k) shard = std::max(shard, r->Shard(b, k).second - r->Shard(b, k).first);
      } else if (options.codec.sparse()) {
        send = std::max(send, EncodedBytes(options.codec, b.size()));
        recv = std::max(recv, EncodedBytes(options.codec, b.size()) * static_cast<size_t>(W));
      } else {
        size_t most = 0;
        for (int k = 0; k < W; ++k) {
          const auto [s, e] = r->Shard(b, k);
          shard = std::max(shard, e - s);
          most = std::max(most, EncodedBytes(options.codec, e - s));
        }
        most = static_cast<size_t>(RoundUp(static_cast<int64_t>(most), 8));
        send = std::max(send, most * static_cast<size_t>(W));
        recv = std::max(recv, most * static_cast<size_t>(W));
      }
    }
    r->send_.resize(send);
    r->recv_.resize(recv);
    r->shard_ = AlignedBuffer(shard);
  } catch (const std::bad_alloc&) {
    return Status::InvalidArgument("gradient reducer: out of memory for its buffers ({} gradient elements)",
                                   grads.size());
  }
  r->pending_.assign(r->buckets_.size(), 0);
  r->done_ = static_cast<int>(r->buckets_.size());  // no step in flight
  r->thread_ = std::thread([p = r.get()] { p->ThreadMain(); });
  return r;
}

GradientReducer::~GradientReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::pair<int64_t, int64_t> GradientReducer::Shard(const Bucket& b, int r) const {
  return ShardOf(b, r, comm_->world(), options_.codec);
}

void GradientReducer::BeginStep(int64_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < buckets_.size(); ++i) pending_[i] = buckets_[i].size();
  done_ = 0;
  queue_.clear();
  step_ = step;
  running_ = ReducerStats{};
  running_.buckets = static_cast<int>(buckets_.size());
  running_.raw_bytes = static_cast<int64_t>(grads_.size()) * 4;
}

void GradientReducer::MarkReady(int64_t begin, int64_t end) {
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const int64_t lo = std::max(begin, buckets_[i].begin), hi = std::min(end, buckets_[i].end);
      if (hi <= lo || pending_[i] <= 0) continue;
      pending_[i] -= hi - lo;
      if (pending_[i] <= 0) {
        queue_.push_back(static_cast<int>(i));
        queued = true;
      }
    }
  }
  if (queued) cv_.notify_all();
}

Status GradientReducer::Finish() {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  // Every bucket that was queued must be finished before anything is reported (the thread may be
  // writing into the gradients).
  int queued_total = 0;
  for (int64_t p : pending_) queued_total += p <= 0 ? 1 : 0;
  running_.overlapped_buckets = done_;
  cv_.wait(lock, [&] { return done_ >= queued_total; });
  running_.exposed_ms = MsSince(t0);
  stats_ = running_;
  if (!error_.ok()) return error_;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    if (pending_[i] > 0) {
      return Status::Internal("gradient reducer: bucket {} (elements [{}, {})) was never completely marked ready "
                              "({} elements missing) — the model's grad-ready ranges do not match the reducer's",
                              i, buckets_[i].begin, buckets_[i].end, pending_[i]);
    }
  }
  return Status::OK();
}

void GradientReducer::ThreadMain() {
  // The communication thread runs its codec loops single-threaded: the compute thread's OpenMP
  // team has the cores while backward is still running.
  omp_set_num_threads(1);
  while (true) {
    int index = -1;
    bool failed = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      index = queue_.front();
      queue_.pop_front();
      failed = !error_.ok();
    }
    Status s = failed ? Status::OK() : ReduceBucket(index);  // after an error, drain without talking
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && error_.ok()) error_ = s;
      ++done_;
      AdvanceProgress();
    }
    cv_.notify_all();
  }
}

Status GradientReducer::ReduceBucket(int index) {
  const Bucket& b = buckets_[static_cast<size_t>(index)];
  const uint64_t seed = Mix(options_.seed ^ Mix(static_cast<uint64_t>(step_) * 1315423911ULL + static_cast<uint64_t>(index)));
  switch (options_.codec.kind) {
    case CodecKind::kNone: return ReduceExact(b);
    case CodecKind::kTopK: return ReduceSparse(b, seed);
    default: return ReduceDense(b, seed);
  }
}

Status GradientReducer::ReduceExact(const Bucket& b) {
  const int W = comm_->world(), me = comm_->rank();
  std::vector<int64_t> counts(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r) counts[static_cast<size_t>(r)] = Shard(b, r).second - Shard(b, r).first;
  const int64_t mine = counts[static_cast<size_t>(me)];
  auto t0 = Clock::now();
  TF_RETURN_IF_ERROR(comm_->ReduceScatterSum(grads_.data() + b.begin, shard_.data(), counts, DataType::kF32));
  double comm_ms = MsSince(t0);
  const float inv = 1.0f / static_cast<float>(W);
  float* s = shard_.data();
  for (int64_t i = 0; i < mine; ++i) s[i] *= inv;
  t0 = Clock::now();
  TF_RETURN_IF_ERROR(comm_->AllGatherV(shard_.data(), grads_.data() + b.begin, counts, DataType::kF32));
  comm_ms += MsSince(t0);
  std::lock_guard<std::mutex> lock(mu_);
  running_.comm_ms += comm_ms;
  running_.wire_bytes += (b.size() - mine) * 4 + mine * 4 * (W - 1);
  return Status::OK();
}

Status GradientReducer::ReduceDense(const Bucket& b, uint64_t seed) {
  const CodecConfig& c = options_.codec;
  const int W = comm_->world(), me = comm_->rank();
  std::vector<std::pair<int64_t, int64_t>> shards(static_cast<size_t>(W));
  size_t most = 0;
  for (int r = 0; r < W; ++r) {
    shards[static_cast<size_t>(r)] = Shard(b, r);
    most = std::max(most, EncodedBytes(c, shards[static_cast<size_t>(r)].second - shards[static_cast<size_t>(r)].first));
  }
  most = static_cast<size_t>(RoundUp(static_cast<int64_t>(most), 8));
  float* residual = residual_.size() > 0 ? residual_.data() : nullptr;
  float* server = server_residual_.size() > 0 ? server_residual_.data() : nullptr;
  double codec_ms = 0, comm_ms = 0;

  // Phase 1: encode every shard of (g + residual); all-to-all; the owner averages its shard.
  auto t0 = Clock::now();
  for (int r = 0; r < W; ++r) {
    const auto [s, e] = shards[static_cast<size_t>(r)];
    // Stochastic rounding streams differ per (rank, shard): ranks must not round alike.
    Encode(c, grads_.data() + s, residual ? residual + s : nullptr, e - s, send_.data() + most * static_cast<size_t>(r),
           Mix(Mix(seed ^ (0x5851f42d4c957f2dULL * static_cast<uint64_t>(me + 1))) + 2 * static_cast<uint64_t>(r)));
  }
  codec_ms += MsSince(t0);
  t0 = Clock::now();
  TF_RETURN_IF_ERROR(comm_->AllToAll(send_.data(), recv_.data(), most));
  comm_ms += MsSince(t0);
  t0 = Clock::now();
  const auto [ms, me_end] = shards[static_cast<size_t>(me)];
  const int64_t mine = me_end - ms;
  shard_.Zero();
  for (int r = 0; r < W; ++r) {
    DecodeAccumulate(c, recv_.data() + most * static_cast<size_t>(r), mine, 1.0f / static_cast<float>(W), shard_.data());
  }
  // Phase 2: the owner re-encodes the average (server residual), all-gather, everyone decodes.
  Encode(c, shard_.data(), server ? server + ms : nullptr, mine, send_.data(), Mix(seed + 2 * static_cast<uint64_t>(me) + 1));
  codec_ms += MsSince(t0);
  t0 = Clock::now();
  TF_RETURN_IF_ERROR(comm_->AllGather(send_.data(), recv_.data(), most));
  comm_ms += MsSince(t0);
  t0 = Clock::now();
  for (int r = 0; r < W; ++r) {
    const auto [s, e] = shards[static_cast<size_t>(r)];
    std::memset(grads_.data() + s, 0, static_cast<size_t>(e - s) * sizeof(float));
    DecodeAccumulate(c, recv_.data() + most * static_cast<size_t>(r), e - s, 1.0f, grads_.data() + s);
  }
  codec_ms += MsSince(t0);
  std::lock_guard<std::mutex> lock(mu_);
  running_.comm_ms += comm_ms;
  running_.codec_ms += codec_ms;
  running_.wire_bytes += 2 * static_cast<int64_t>(most) * (W - 1);
  return Status::OK();
}

Status GradientReducer::ReduceSparse(const Bucket& b, uint64_t seed) {
  const CodecConfig& c = options_.codec;
  const int W = comm_->world();
  const size_t bytes = EncodedBytes(c, b.size());
  float* residual = residual_.size() > 0 ? residual_.data() + b.begin : nullptr;
  auto t0 = Clock::now();
  Encode(c, grads_.data() + b.begin, residual, b.size(), send_.data(), seed);
  double codec_ms = MsSince(t0);
  t0 = Clock::now();
  TF_RETURN_IF_ERROR(comm_->AllGather(send_.data(), recv_.data(), bytes));
  const double comm_ms = MsSince(t0);
  t0 = Clock::now();
  std::memset(grads_.data() + b.begin, 0, static_cast<size_t>(b.size()) * sizeof(float));
  for (int r = 0; r < W; ++r) {
    DecodeAccumulate(c, recv_.data() + bytes * static_cast<size_t>(r), b.size(), 1.0f / static_cast<float>(W),
                     grads_.data() + b.begin);
  }
  codec_ms += MsSince(t0);
  std::lock_guard<std::mutex> lock(mu_);
  running_.comm_ms += comm_ms;
  running_.codec_ms += codec_ms;
  running_.wire_bytes += static_cast<int64_t>(bytes) * (W - 1);
  return Status::OK();
}

Status GradientReducer::GetState(std::vector<float>* residual, std::vector<float>* server) {
  residual->assign(residual_.span().begin(), residual_.span().end());
  server->assign(server_residual_.span().begin(), server_residual_.span().end());
  return Status::OK();
}

Status GradientReducer::SetState(std::span<const float> residual, std::span<const float> server) {
  if (static_cast<int64_t>(residual.size()) != residual_.size() ||
      static_cast<int64_t>(server.size()) != server_residual_.size()) {
    return Status::InvalidArgument("error-feedback state has {} + {} elements, this reducer ({}) keeps {} + {}",
                                   residual.size(), server.size(), CodecName(options_.codec), residual_.size(),
                                   server_residual_.size());
  }
  std::copy(residual.begin(), residual.end(), residual_.data());
  std::copy(server.begin(), server.end(), server_residual_.data());
  return Status::OK();
}

}  // namespace tf::comm
