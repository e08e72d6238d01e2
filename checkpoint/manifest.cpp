#include "checkpoint/manifest.h"

#include <charconv>
#include <set>

#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "base/clock.h"
#include "base/json.h"

namespace tf::checkpoint {
namespace {

using json = nlohmann::json;

uint64_t Hash(std::string_view data) { return XXH64(data.data(), data.size(), 0); }
std::string Hex(uint64_t v) { return fmt::format("{:016x}", v); }

StatusOr<uint64_t> ParseHex(const json& v, const std::string& what, const std::string& source) {
  uint64_t out = 0;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out, 16);
    if (s.size() == 16 && ec == std::errc() && end == s.data() + s.size()) return out;
  }
  return Status::Corruption("{}: {} is {}, not 16 hex digits", source, what, v.dump());
}

// The field `key` of object `j` with JSON type `is`, else Corruption naming it.
template <typename Pred>
StatusOr<const json*> Field(const json& j, const char* key, Pred is, const char* type, const std::string& source) {
  if (!j.contains(key)) return Status::Corruption("{}: no \"{}\"", source, key);
  const json& v = j.at(key);
  if (!is(v)) return Status::Corruption("{}: \"{}\" is {}, not {}", source, key, v.dump(), type);
  return &v;
}

json Body(const Manifest& m) {
  json tensors = json::array();
  for (const TensorEntry& t : m.tensors) {
    tensors.push_back({{"name", t.name}, {"elements", t.elements}, {"chunk_elements", t.chunk_elements}});
  }
  json objects = json::array();
  for (const ObjectEntry& o : m.objects) {
    json e = {{"key", o.key}, {"bytes", o.bytes}, {"xxh64", Hex(o.xxh64)}};
    if (!o.tensor.empty()) {
      e["tensor"] = o.tensor;
      e["chunk"] = o.chunk;
      e["encoding"] = o.encoding;
      if (!o.base.empty()) e["base"] = o.base;
    }
    objects.push_back(std::move(e));
  }
  return {{"format", kManifestFormat}, {"version", kManifestVersion}, {"step", m.step},
          {"kind", m.kind},           {"created", m.created},          {"code_version", m.code_version},
          {"world", m.world},         {"state", m.state},              {"tensors", tensors},
          {"objects", objects}};
}

}  // namespace

std::string CheckpointPrefix(int64_t step) { return fmt::format("step-{:012d}", step); }

int64_t StepOfKey(std::string_view key) {
  const std::string_view dir = key.substr(0, key.find('/'));
  if (!dir.starts_with("step-") || dir.size() != 17) return -1;
  int64_t step = -1;
  const auto [end, ec] = std::from_chars(dir.data() + 5, dir.data() + dir.size(), step);
  return ec == std::errc() && end == dir.data() + dir.size() && step >= 0 ? step : -1;
}

const TensorEntry* Manifest::FindTensor(const std::string& name) const {
  for (const TensorEntry& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::string SerializeManifest(const Manifest& m) {
  json j = Body(m);
  j["checksum"] = Hex(Hash(j.dump()));
  return j.dump(1) + "\n";
}

StatusOr<Manifest> ParseManifest(std::string_view text, const std::string& source, bool complete) {
  StatusOr<json> parsed = ParseJson(text, source, /*allow_comments=*/false);
  if (!parsed.ok()) return Status::Corruption("{}", parsed.status().message());
  const json& j = *parsed;
  if (!j.is_object()) return Status::Corruption("{}: not a JSON object", source);
  auto is_string = [](const json& v) { return v.is_string(); };
  auto is_int = [](const json& v) { return v.is_number_integer(); };
  auto is_uint = [](const json& v) { return v.is_number_unsigned(); };
  TF_ASSIGN_OR_RETURN(const json* format, Field(j, "format", is_string, "a string", source));
  if (*format != kManifestFormat) {
    return Status::Corruption("{}: format is {}, not \"{}\"", source, format->dump(), kManifestFormat);
  }
  TF_ASSIGN_OR_RETURN(const json* version, Field(j, "version", is_int, "an integer", source));
  if (*version > kManifestVersion) {
    return Status::Unimplemented("{}: checkpoint format version {} is newer than this build reads ({}): use a "
                                 "TrainFlow that reads version {}, or another checkpoint directory",
                                 source, version->dump(), kManifestVersion, version->dump());
  }
  if (*version != kManifestVersion) {
    return Status::Corruption("{}: format version {} is not the one this build reads ({})", source, version->dump(),
                              kManifestVersion);
  }
  TF_ASSIGN_OR_RETURN(const json* checksum, Field(j, "checksum", is_string, "a string", source));
  TF_ASSIGN_OR_RETURN(const uint64_t expected, ParseHex(*checksum, "checksum", source));
  json body = j;
  body.erase("checksum");
  if (const uint64_t found = Hash(body.dump()); found != expected) {
    return Status::Corruption("{}: checksum is {} but the content hashes to {} (damaged or edited)", source,
                              Hex(expected), Hex(found));
  }
  Manifest m;
  TF_ASSIGN_OR_RETURN(const json* step, Field(j, "step", is_int, "an integer", source));
  m.step = step->get<int64_t>();
  if (m.step < 0) return Status::Corruption("{}: step {} is negative", source, m.step);
  TF_ASSIGN_OR_RETURN(const json* kind, Field(j, "kind", is_string, "a string", source));
  m.kind = kind->get<std::string>();
  if (m.kind != kKindFull && m.kind != kKindIncremental) {
    return Status::Corruption("{}: kind \"{}\" is not one this build reads ({} or {})", source, m.kind, kKindFull,
                              kKindIncremental);
  }
  TF_ASSIGN_OR_RETURN(const json* created, Field(j, "created", is_string, "a string", source));
  m.created = created->get<std::string>();
  TF_ASSIGN_OR_RETURN(const json* code, Field(j, "code_version", is_string, "a string", source));
  m.code_version = code->get<std::string>();
  TF_ASSIGN_OR_RETURN(const json* world, Field(j, "world", is_int, "an integer", source));
  if (*world < 1 || *world > (1 << 20)) return Status::Corruption("{}: world {} is out of range", source, world->dump());
  m.world = world->get<int>();
  TF_ASSIGN_OR_RETURN(const json* state, Field(j, "state", [](const json& v) { return v.is_object(); }, "an object",
                                               source));
  m.state = *state;
  TF_ASSIGN_OR_RETURN(const json* tensors, Field(j, "tensors", [](const json& v) { return v.is_array(); }, "an array",
                                                 source));
  for (size_t i = 0; i < tensors->size(); ++i) {
    const json& t = (*tensors)[i];
    const std::string where = fmt::format("{} (tensors[{}])", source, i);
    if (!t.is_object()) return Status::Corruption("{}: not an object", where);
    TensorEntry e;
    TF_ASSIGN_OR_RETURN(const json* name, Field(t, "name", is_string, "a string", where));
    e.name = name->get<std::string>();
    TF_ASSIGN_OR_RETURN(const json* elements, Field(t, "elements", is_uint, "a non-negative integer", where));
    e.elements = elements->get<int64_t>();
    TF_ASSIGN_OR_RETURN(const json* chunk, Field(t, "chunk_elements", is_uint, "a non-negative integer", where));
    e.chunk_elements = chunk->get<int64_t>();
    if (e.name.empty() || e.elements < 0 || e.chunk_elements < 1 || e.elements > (int64_t{1} << 40)) {
      return Status::Corruption("{}: tensor '{}' with {} elements in chunks of {}", where, e.name, e.elements,
                                e.chunk_elements);
    }
    if (m.FindTensor(e.name) != nullptr) return Status::Corruption("{}: tensor '{}' is listed twice", where, e.name);
    m.tensors.push_back(std::move(e));
  }
  TF_ASSIGN_OR_RETURN(const json* objects, Field(j, "objects", [](const json& v) { return v.is_array(); }, "an array",
                                                 source));
  std::set<std::string> seen;
  std::set<std::pair<std::string, int64_t>> chunks;
  for (size_t i = 0; i < objects->size(); ++i) {
    const json& o = (*objects)[i];
    const std::string where = fmt::format("{} (objects[{}])", source, i);
    if (!o.is_object()) return Status::Corruption("{}: not an object", where);
    ObjectEntry e;
    TF_ASSIGN_OR_RETURN(const json* key, Field(o, "key", is_string, "a string", where));
    e.key = key->get<std::string>();
    if (Status s = ValidateKey(e.key); !s.ok()) return Status::Corruption("{}: {}", where, s.message());
    if (StepOfKey(e.key) < 0) return Status::Corruption("{}: key '{}' is not under a step-... prefix", where, e.key);
    if (!seen.insert(e.key).second) return Status::Corruption("{}: key '{}' is listed twice", where, e.key);
    TF_ASSIGN_OR_RETURN(const json* bytes, Field(o, "bytes", is_uint, "a non-negative integer", where));
    e.bytes = bytes->get<uint64_t>();
    TF_ASSIGN_OR_RETURN(const json* hash, Field(o, "xxh64", is_string, "a string", where));
    TF_ASSIGN_OR_RETURN(e.xxh64, ParseHex(*hash, "xxh64", where));
    if (o.contains("tensor")) {
      TF_ASSIGN_OR_RETURN(const json* tensor, Field(o, "tensor", is_string, "a string", where));
      e.tensor = tensor->get<std::string>();
      const TensorEntry* t = m.FindTensor(e.tensor);
      if (t == nullptr) return Status::Corruption("{}: chunk of tensor '{}', which \"tensors\" does not list", where, e.tensor);
      TF_ASSIGN_OR_RETURN(const json* chunk, Field(o, "chunk", is_uint, "a non-negative integer", where));
      e.chunk = chunk->get<int64_t>();
      if (e.chunk >= t->chunks()) {
        return Status::Corruption("{}: chunk {} of tensor '{}', which has {}", where, e.chunk, e.tensor, t->chunks());
      }
      if (!chunks.insert({e.tensor, e.chunk}).second) {
        return Status::Corruption("{}: chunk {} of tensor '{}' is listed twice", where, e.chunk, e.tensor);
      }
      TF_ASSIGN_OR_RETURN(const json* encoding, Field(o, "encoding", is_string, "a string", where));
      e.encoding = encoding->get<std::string>();
      if (o.contains("base")) {
        TF_ASSIGN_OR_RETURN(const json* base, Field(o, "base", is_string, "a string", where));
        e.base = base->get<std::string>();
        if (!ValidateKey(e.base).ok() || StepOfKey(e.base) < 0) {
          return Status::Corruption("{}: base '{}' is not a key under a step-... prefix", where, e.base);
        }
      }
    }
    m.objects.push_back(std::move(e));
  }
  for (const TensorEntry& t : m.tensors) {
    for (int64_t c = 0; complete && c < t.chunks(); ++c) {
      if (!chunks.contains({t.name, c})) {
        return Status::Corruption("{}: tensor '{}' lacks chunk {} of {}", source, t.name, c, t.chunks());
      }
    }
  }
  return m;
}

Status WriteCheckpoint(ObjectStore& store, Manifest m, const std::vector<std::pair<std::string, std::string>>& objects) {
  const std::string prefix = CheckpointPrefix(m.step) + "/";
  m.objects.clear();
  for (const auto& [key, data] : objects) {
    TF_RETURN_IF_ERROR(store.Put(prefix + key, data));
    ObjectEntry e;
    e.key = prefix + key;
    e.bytes = data.size();
    e.xxh64 = Hash(data);
    m.objects.push_back(std::move(e));
  }
  return CommitManifest(store, std::move(m));
}

Status CommitManifest(ObjectStore& store, Manifest m) {
  if (m.created.empty()) m.created = IsoUtc(UnixSeconds());
  return store.Put(CheckpointPrefix(m.step) + "/" + kManifestName, SerializeManifest(m));
}

StatusOr<Manifest> ReadManifest(ObjectStore& store, int64_t step) {
  const std::string key = CheckpointPrefix(step) + "/" + kManifestName;
  auto text = store.Get(key);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) {
      return Status::NotFound("{}/{}: no manifest (an unfinished or failed write)", store.location(),
                              CheckpointPrefix(step));
    }
    return text.status();
  }
  TF_ASSIGN_OR_RETURN(Manifest m, ParseManifest(*text, store.location() + "/" + key));
  if (m.step != step) return Status::Corruption("{}/{}: the manifest says step {}", store.location(), key, m.step);
  return m;
}

StatusOr<std::vector<Listed>> ListCheckpoints(ObjectStore& store) {
  TF_ASSIGN_OR_RETURN(const std::vector<std::string> keys, store.List("step-"));
  std::vector<Listed> out;
  for (const std::string& key : keys) {
    const int64_t step = StepOfKey(key);
    if (step < 0 || (!out.empty() && out.back().step == step)) continue;
    Listed l;
    l.step = step;
    auto m = ReadManifest(store, step);
    if (m.ok()) {
      l.manifest = std::move(*m);
    } else {
      l.problem = m.status();
    }
    out.push_back(std::move(l));
  }
  return out;
}

Status CheckObject(const ObjectStore& store, const ObjectEntry& o, std::string_view data) {
  if (data.size() != o.bytes) {
    return Status::Corruption("{}/{}: {} bytes, the manifest says {}", store.location(), o.key, data.size(), o.bytes);
  }
  if (const uint64_t found = Hash(data); found != o.xxh64) {
    return Status::Corruption("{}/{}: xxh64 {}, the manifest says {}", store.location(), o.key, Hex(found),
                              Hex(o.xxh64));
  }
  return Status::OK();
}

Status VerifyCheckpoint(ObjectStore& store, const Manifest& m) {
  for (const ObjectEntry& o : m.objects) {
    TF_ASSIGN_OR_RETURN(const std::string data, store.Get(o.key));
    TF_RETURN_IF_ERROR(CheckObject(store, o, data));
  }
  return Status::OK();
}

std::set<int64_t> Dependencies(const Manifest& m) {
  std::set<int64_t> steps = {m.step};
  for (const ObjectEntry& o : m.objects) {
    steps.insert(StepOfKey(o.key));
    if (!o.base.empty()) steps.insert(StepOfKey(o.base));
  }
  steps.erase(-1);
  return steps;
}

Status CheckNoNewerFormat(ObjectStore& store) {
  TF_ASSIGN_OR_RETURN(const std::vector<Listed> all, ListCheckpoints(store));
  for (const Listed& l : all) {
    if (IsNewerFormat(l.problem)) return l.problem;
  }
  return Status::OK();
}

StatusOr<Manifest> NewestValidCheckpoint(ObjectStore& store, std::vector<std::pair<int64_t, Status>>* skipped) {
  TF_ASSIGN_OR_RETURN(std::vector<Listed> all, ListCheckpoints(store));
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    Status s = it->problem;
    if (s.ok()) s = VerifyCheckpoint(store, *it->manifest);
    if (s.ok()) return std::move(*it->manifest);
    if (skipped != nullptr) skipped->emplace_back(it->step, s);
  }
  return Status::NotFound("{}: no valid checkpoint", store.location());
}

}  // namespace tf::checkpoint
