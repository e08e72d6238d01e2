// What an incremental checkpoint at step S would store against a full one at step B, per component
// (params, adam.m, adam.v, ef.residual, ef.server), computed from two checkpoints of a run with the
// writer's own rules (checkpoint/checkpointer.cpp): an unchanged chunk costs nothing, a changed one
// the smaller of its own encoding (planes + zstd, or raw) and its XOR-planes delta against B's chunk.
// It reads any two checkpoints of the same model (full or incremental; restored bit-exactly), so a
// run that keeps, say, every 100th checkpoint gives the sizes at every interval without keeping a
// chain per interval. Prints one markdown table: raw, full (planes + zstd) and incremental sizes.
//
// Run: build/bench/checkpoint_delta_sizes DIR_OR_S3 BASE_STEP STEP [STEP...]
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/chunk_codec.h"
#include "checkpoint/manifest.h"
#include "checkpoint/object_store.h"

namespace tf::checkpoint {
namespace {

std::string Component(const std::string& tensor) {
  if (tensor.rfind("ef.", 0) == 0) return tensor.substr(0, tensor.find('.', 3));  // ef.residual.r0 -> ef.residual
  return tensor;
}

StatusOr<std::vector<float>> ReadTensor(ObjectStore& store, const Manifest& m, const TensorEntry& t) {
  std::vector<float> data(static_cast<size_t>(t.elements));
  TF_RETURN_IF_ERROR(ReadTensorRange(store, m, t.name, 0, t.elements, data));
  return data;
}

using Sizes = std::map<std::string, uint64_t>;  // component -> bytes

// Sizes of `m`'s state as the writer would store it: against `base` when given, else full.
StatusOr<Sizes> StoredSizes(ObjectStore& store, const Manifest& m, const Manifest* base) {
  Sizes sizes;
  for (const TensorEntry& t : m.tensors) {
    TF_ASSIGN_OR_RETURN(const std::vector<float> data, ReadTensor(store, m, t));
    std::vector<float> prior;
    if (base != nullptr) {
      const TensorEntry* bt = nullptr;
      for (const TensorEntry& e : base->tensors) {
        if (e.name == t.name) bt = &e;
      }
      if (bt == nullptr || bt->elements != t.elements) {
        return Status::InvalidArgument("tensor {} of step {} is not in step {} with the same size", t.name, m.step,
                                       base->step);
      }
      TF_ASSIGN_OR_RETURN(prior, ReadTensor(store, *base, *bt));
    }
    ByteBuffer out;
    uint64_t& total = sizes[Component(t.name)];
    for (int64_t b = 0; b < t.elements; b += t.chunk_elements) {
      const auto n = static_cast<size_t>(std::min(t.chunk_elements, t.elements - b));
      const std::span<const float> chunk(data.data() + b, n);
      std::span<const float> against;
      if (base != nullptr) {
        against = std::span<const float>(prior.data() + b, n);
        if (std::memcmp(chunk.data(), against.data(), chunk.size_bytes()) == 0) continue;  // referenced
      }
      EncodeChunkInto(chunk, against, {}, out);
      total += out.size();
    }
  }
  return sizes;
}

StatusOr<int64_t> ParseStep(const char* text) {
  int64_t v = 0;
  const char* end = text + std::strlen(text);
  const auto [p, ec] = std::from_chars(text, end, v);
  if (ec != std::errc() || p != end || v < 0) return Status::InvalidArgument("'{}' is not a step number", text);
  return v;
}

int Main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s DIR_OR_S3 BASE_STEP STEP [STEP...]\n", argv[0]);
    return 2;
  }
  auto store = OpenStore(argv[1]);
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  };
  auto base_step = ParseStep(argv[2]);
  if (!base_step.ok()) return fail(base_step.status());
  auto base = ReadManifest(**store, *base_step);
  if (!base.ok()) return fail(base.status());
  Sizes raw;
  for (const TensorEntry& t : base->tensors) raw[Component(t.name)] += static_cast<uint64_t>(t.elements) * 4;
  std::vector<std::pair<std::string, Sizes>> rows;
  auto full = StoredSizes(**store, *base, nullptr);
  if (!full.ok()) return fail(full.status());
  rows.emplace_back(fmt::format("full at step {} (planes + zstd)", base->step), *full);
  for (int i = 3; i < argc; ++i) {
    auto step = ParseStep(argv[i]);
    if (!step.ok()) return fail(step.status());
    auto m = ReadManifest(**store, *step);
    if (!m.ok()) return fail(m.status());
    auto inc = StoredSizes(**store, *m, &*base);
    if (!inc.ok()) return fail(inc.status());
    rows.emplace_back(fmt::format("incremental at step {} ({} after)", m->step, m->step - base->step), *inc);
  }
  auto mib = [](uint64_t b) { return fmt::format("{:.2f} MiB", static_cast<double>(b) / (1 << 20)); };
  std::string header = "| checkpoint |", rule = "|---|";
  for (const auto& [c, _] : raw) {
    header += fmt::format(" {} |", c);
    rule += "---|";
  }
  std::printf("%s total | vs raw full |\n%s---|---|\n", header.c_str(), rule.c_str());
  uint64_t raw_total = 0;
  std::string line = "| raw full |";
  for (const auto& [c, b] : raw) {
    line += fmt::format(" {} |", mib(b));
    raw_total += b;
  }
  std::printf("%s %s | 1.00x |\n", line.c_str(), mib(raw_total).c_str());
  for (const auto& [name, sizes] : rows) {
    uint64_t total = 0;
    line = fmt::format("| {} |", name);
    for (const auto& [c, b] : raw) {
      const auto it = sizes.find(c);
      const uint64_t s = it == sizes.end() ? 0 : it->second;
      line += fmt::format(" {} ({:.2f}x) |", mib(s), s == 0 ? 0.0 : static_cast<double>(b) / s);
      total += s;
    }
    std::printf("%s %s | %.2fx smaller |\n", line.c_str(), mib(total).c_str(),
                static_cast<double>(raw_total) / std::max<uint64_t>(total, 1));
  }
  return 0;
}

}  // namespace
}  // namespace tf::checkpoint

int main(int argc, char** argv) { return tf::checkpoint::Main(argc, argv); }
