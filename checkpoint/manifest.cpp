#include "checkpoint/manifest.h"

#include <charconv>
#include <chrono>
#include <set>

#include <fmt/chrono.h>
#include <fmt/format.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

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
  json objects = json::array();
  for (const ObjectEntry& o : m.objects) objects.push_back({{"key", o.key}, {"bytes", o.bytes}, {"xxh64", Hex(o.xxh64)}});
  return {{"format", kManifestFormat}, {"version", kManifestVersion}, {"step", m.step},
          {"kind", m.kind},           {"created", m.created},          {"code_version", m.code_version},
          {"world", m.world},         {"state", m.state},              {"objects", objects}};
}

}  // namespace

std::string CheckpointPrefix(int64_t step) { return fmt::format("step-{:012d}", step); }

std::string SerializeManifest(const Manifest& m) {
  json j = Body(m);
  j["checksum"] = Hex(Hash(j.dump()));
  return j.dump(1) + "\n";
}

StatusOr<Manifest> ParseManifest(std::string_view text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption("{}: not a JSON object", source);
  auto is_string = [](const json& v) { return v.is_string(); };
  auto is_int = [](const json& v) { return v.is_number_integer(); };
  auto is_uint = [](const json& v) { return v.is_number_unsigned(); };
  TF_ASSIGN_OR_RETURN(const json* format, Field(j, "format", is_string, "a string", source));
  if (*format != kManifestFormat) {
    return Status::Corruption("{}: format is {}, not \"{}\"", source, format->dump(), kManifestFormat);
  }
  TF_ASSIGN_OR_RETURN(const json* version, Field(j, "version", is_int, "an integer", source));
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
  if (m.kind != "full") return Status::Corruption("{}: kind \"{}\" is not one this build reads (full)", source, m.kind);
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
  TF_ASSIGN_OR_RETURN(const json* objects, Field(j, "objects", [](const json& v) { return v.is_array(); }, "an array",
                                                 source));
  std::set<std::string> seen;
  for (size_t i = 0; i < objects->size(); ++i) {
    const json& o = (*objects)[i];
    const std::string where = fmt::format("{} (objects[{}])", source, i);
    if (!o.is_object()) return Status::Corruption("{}: not an object", where);
    ObjectEntry e;
    TF_ASSIGN_OR_RETURN(const json* key, Field(o, "key", is_string, "a string", where));
    e.key = key->get<std::string>();
    if (Status s = ValidateKey(e.key); !s.ok()) return Status::Corruption("{}: {}", where, s.message());
    if (!seen.insert(e.key).second) return Status::Corruption("{}: key '{}' is listed twice", where, e.key);
    TF_ASSIGN_OR_RETURN(const json* bytes, Field(o, "bytes", is_uint, "a non-negative integer", where));
    e.bytes = bytes->get<uint64_t>();
    TF_ASSIGN_OR_RETURN(const json* hash, Field(o, "xxh64", is_string, "a string", where));
    TF_ASSIGN_OR_RETURN(e.xxh64, ParseHex(*hash, "xxh64", where));
    m.objects.push_back(std::move(e));
  }
  return m;
}

Status WriteCheckpoint(ObjectStore& store, Manifest m, const std::vector<std::pair<std::string, std::string>>& objects) {
  const std::string prefix = CheckpointPrefix(m.step) + "/";
  m.objects.clear();
  for (const auto& [key, data] : objects) {
    TF_RETURN_IF_ERROR(store.Put(prefix + key, data));
    m.objects.push_back({key, data.size(), Hash(data)});
  }
  if (m.created.empty()) m.created = fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr)));
  return store.Put(prefix + kManifestName, SerializeManifest(m));
}

StatusOr<std::vector<Listed>> ListCheckpoints(ObjectStore& store) {
  TF_ASSIGN_OR_RETURN(const std::vector<std::string> keys, store.List("step-"));
  std::vector<Listed> out;
  for (const std::string& key : keys) {
    const size_t slash = key.find('/');
    const std::string dir = key.substr(0, slash);
    int64_t step = -1;
    const std::string digits = dir.substr(5);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
    if (ec != std::errc() || end != digits.data() + digits.size() || dir != CheckpointPrefix(step)) continue;
    if (!out.empty() && out.back().step == step) continue;
    Listed l;
    l.step = step;
    const std::string manifest_key = dir + "/" + kManifestName;
    auto text = store.Get(manifest_key);
    if (!text.ok()) {
      l.problem = text.status().code() == StatusCode::kNotFound
                      ? Status::NotFound("{}/{}: no manifest (an unfinished or failed write)", store.location(), dir)
                      : text.status();
    } else if (auto m = ParseManifest(*text, store.location() + "/" + manifest_key); !m.ok()) {
      l.problem = m.status();
    } else if (m->step != step) {
      l.problem = Status::Corruption("{}/{}: the manifest says step {}", store.location(), manifest_key, m->step);
    } else {
      l.manifest = std::move(*m);
    }
    out.push_back(std::move(l));
  }
  return out;
}

Status VerifyCheckpoint(ObjectStore& store, const Manifest& m) {
  const std::string prefix = CheckpointPrefix(m.step) + "/";
  for (const ObjectEntry& o : m.objects) {
    TF_ASSIGN_OR_RETURN(const std::string data, store.Get(prefix + o.key));
    const std::string where = store.location() + "/" + prefix + o.key;
    if (data.size() != o.bytes) {
      return Status::Corruption("{}: {} bytes, the manifest says {}", where, data.size(), o.bytes);
    }
    if (const uint64_t found = Hash(data); found != o.xxh64) {
      return Status::Corruption("{}: xxh64 {}, the manifest says {}", where, Hex(found), Hex(o.xxh64));
    }
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
