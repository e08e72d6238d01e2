// Safetensors reader/writer. Format: docs/formats.md ("Safetensors").
#include "model/safetensors.h"

#include "base/float16.h"
#include "base/json.h"


#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>


namespace tf {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O copies little-endian bytes straight into memory");

constexpr const char* kMetadataKey = "__metadata__";
constexpr size_t kConvertChunk = 1 << 16;  // elements converted per write/read batch

// ---- Dtypes ----------------------------------------------------------------------------------

struct Dtype {
  SafetensorsDtype id;
  const char* name;
  size_t bytes;
};
constexpr Dtype kDtypes[] = {
    {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},
};
const Dtype* FindDtype(const std::string& name) {
  for (const Dtype& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}
const Dtype& DtypeOf(SafetensorsDtype id) {
  for (const Dtype& d : kDtypes)
    if (d.id == id) return d;
  return kDtypes[0];
}

// ---- File helpers ----------------------------------------------------------------------------

// ---- Header validation -----------------------------------------------------------------------

struct Entry {
  std::string name;
  const Dtype* dtype = nullptr;
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  uint64_t begin = 0, end = 0;
};

// A JSON integer in [0, INT64_MAX], or nullopt.
std::optional<int64_t> NonNegativeInt(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return i;
  }
  return std::nullopt;
}

StatusOr<Entry> ParseEntry(const std::string& path, const std::string& name,
                           const nlohmann::json& v, uint64_t data_size) {
  const std::string where = fmt::format("{}: tensor '{}'", path, name);
  if (!v.is_object())
    return Status::Corruption("{}: header entry is a JSON {}, expected an object", where,
                              v.type_name());
  Entry e;
  e.name = name;

  auto dt = v.find("dtype");
  if (dt == v.end() || !dt->is_string())
    return Status::Corruption("{}: field 'dtype' missing or not a string", where);
  const std::string dtype_name = dt->get<std::string>();
  e.dtype = FindDtype(dtype_name);
  if (e.dtype == nullptr)
    return Status::InvalidArgument("{}: dtype '{}' is not supported (supported: F32, F16, BF16)",
                                   where, dtype_name);

  auto sh = v.find("shape");
  if (sh == v.end() || !sh->is_array())
    return Status::Corruption("{}: field 'shape' missing or not an array", where);
  for (size_t i = 0; i < sh->size(); ++i) {
    std::optional<int64_t> d = NonNegativeInt((*sh)[i]);
    if (!d)
      return Status::Corruption("{}: shape[{}] = {} is not a non-negative integer", where, i,
                                (*sh)[i].dump());
    e.shape.push_back(*d);
    if (__builtin_mul_overflow(e.numel, static_cast<uint64_t>(*d), &e.numel))
      return Status::Corruption("{}: shape {} has too many elements", where, sh->dump());
  }

  auto off = v.find("data_offsets");
  if (off == v.end() || !off->is_array() || off->size() != 2)
    return Status::Corruption("{}: field 'data_offsets' missing or not a [begin, end] pair",
                              where);
  std::optional<int64_t> b = NonNegativeInt((*off)[0]), en = NonNegativeInt((*off)[1]);
  if (!b || !en)
    return Status::Corruption("{}: data_offsets {} are not non-negative integers", where,
                              off->dump());
  e.begin = static_cast<uint64_t>(*b);
  e.end = static_cast<uint64_t>(*en);
  if (e.begin > e.end)
    return Status::Corruption("{}: data_offsets [{}, {}] has begin > end", where, e.begin, e.end);
  if (e.end > data_size)
    return Status::Corruption("{}: data_offsets [{}, {}] run past the data buffer ({} bytes)",
                              where, e.begin, e.end, data_size);
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(e.numel, static_cast<uint64_t>(e.dtype->bytes), &nbytes) ||
      nbytes != e.end - e.begin)
    return Status::Corruption(
        "{}: data_offsets [{}, {}] span {} bytes but shape {} x {} needs {} x {} bytes", where,
        e.begin, e.end, e.end - e.begin, sh->dump(), e.dtype->name, e.numel, e.dtype->bytes);
  return e;
}

Status ReadTensorData(const RandomAccessFile& file, uint64_t data_start, const Entry& e, NamedTensor* out) {
  out->data.resize(e.numel);
  const uint64_t at = data_start + e.begin;
  if (e.dtype->id == SafetensorsDtype::kF32)
    return file.ReadExact(at, e.numel * sizeof(float), reinterpret_cast<char*>(out->data.data()));
  std::vector<uint16_t> buf(std::min<uint64_t>(e.numel, kConvertChunk));
  for (uint64_t i = 0; i < e.numel; i += buf.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), e.numel - i));
    TF_RETURN_IF_ERROR(file.ReadExact(at + i * 2, n * 2, reinterpret_cast<char*>(buf.data())));
    float* dst = out->data.data() + i;
    if (e.dtype->id == SafetensorsDtype::kF16) {
      for (size_t j = 0; j < n; ++j) dst[j] = HalfToFloat(buf[j]);
    } else {
      for (size_t j = 0; j < n; ++j) dst[j] = Bf16ToFloat(buf[j]);
    }
  }
  return Status::OK();
}

StatusOr<SafetensorsContents> Read(const std::string& path, Env* env, bool with_data) {
  auto opened = env->NewRandomAccessFile(path);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) return Status::NotFound("{}: no such file", path);
    return opened.status();
  }
  const RandomAccessFile& file = **opened;
  const uint64_t file_size = file.size();
  if (file_size < 8)
    return Status::Corruption("{}: file is {} bytes, shorter than the 8-byte header length",
                              path, file_size);

  uint64_t header_len = 0;
  TF_RETURN_IF_ERROR(file.ReadExact(0, 8, reinterpret_cast<char*>(&header_len)));
  if (header_len > kSafetensorsMaxHeaderBytes)
    return Status::Corruption("{}: header length {} exceeds the {} byte limit", path, header_len,
                              kSafetensorsMaxHeaderBytes);
  if (header_len > file_size - 8)
    return Status::Corruption("{}: header length {} runs past the end of the {} byte file", path,
                              header_len, file_size);
  std::string header(static_cast<size_t>(header_len), '\0');
  TF_RETURN_IF_ERROR(file.ReadExact(8, header.size(), header.data()));

  // The header is a JSON object: anything else (random bytes, another format) is not a safetensors
  // file, whatever else is wrong with it.
  if (const size_t first = header.find_first_not_of(" \t\r\n"); first == std::string::npos || header[first] != '{') {
    return Status::Corruption("{}: not a safetensors file: its {}-byte header is not a JSON object (it starts with "
                              "'{}')",
                              path, header_len, QuoteForMessage(header.substr(0, std::min<size_t>(header.size(), 8))));
  }
  // Only trailing spaces may pad the JSON (a NUL would end nlohmann's input early); duplicate keys
  // and deep nesting are refused by ParseJson.
  auto parsed = ParseJson(header, path + ": header", /*allow_comments=*/false);
  if (!parsed.ok()) return Status(StatusCode::kCorruption, parsed.status().message());
  const nlohmann::json& j = *parsed;

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;
  SafetensorsContents out;
  std::vector<Entry> entries;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it->is_object())
        return Status::Corruption("{}: '__metadata__' is a JSON {}, expected an object", path,
                                  it->type_name());
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return Status::Corruption("{}: __metadata__ key '{}' is a JSON {}, expected a string",
                                    path, m.key(), m->type_name());
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    TF_ASSIGN_OR_RETURN(Entry e, ParseEntry(path, it.key(), it.value(), data_size));
    entries.push_back(std::move(e));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  // The data buffer must be tiled exactly: no overlap, no gap, nothing after the last tensor.
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered)
      return Status::Corruption("{}: tensor '{}' bytes [{}, {}) overlap tensor '{}' [{}, {})",
                                path, e.name, e.begin, e.end, prev->name, prev->begin, prev->end);
    if (e.begin > covered)
      return Status::Corruption(
          "{}: data buffer bytes [{}, {}) are not covered by any tensor (before tensor '{}')",
          path, covered, e.begin, e.name);
    covered = e.end;
    prev = &e;
  }
  if (covered != data_size)
    return Status::Corruption(
        "{}: data buffer bytes [{}, {}) are not covered by any tensor (buffer is {} bytes)", path,
        covered, data_size, data_size);

  if (!with_data) return out;
  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    NamedTensor t;
    t.name = e.name;
    t.shape = e.shape;
    TF_RETURN_IF_ERROR(ReadTensorData(file, data_start, e, &t));
    out.tensors.push_back(std::move(t));
  }
  return out;
}

}  // namespace

StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path, Env* env) {
  return Read(path, env, /*with_data=*/true);
}

StatusOr<std::map<std::string, std::string>> ReadSafetensorsMetadata(const std::string& path, Env* env) {
  TF_ASSIGN_OR_RETURN(SafetensorsContents c, Read(path, env, /*with_data=*/false));
  return std::move(c.metadata);
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata, SafetensorsDtype dtype, Env* env) {
  const Dtype& dt = DtypeOf(dtype);
  std::vector<uint64_t> numels;
  numels.reserve(tensors.size());
  std::set<std::string> names;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[kMetadataKey] = std::move(m);
  }
  uint64_t offset = 0;
  for (const TensorView& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey)
      return Status::InvalidArgument("{}: invalid tensor name '{}'", path, t.name);
    if (!names.insert(t.name).second)
      return Status::InvalidArgument("{}: tensor '{}' given more than once", path, t.name);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return Status::InvalidArgument("{}: tensor '{}' has negative dimension {}", path, t.name,
                                       d);
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel))
        return Status::InvalidArgument("{}: tensor '{}' has too many elements", path, t.name);
    }
    if (numel > 0 && t.data == nullptr)
      return Status::InvalidArgument("{}: tensor '{}' has {} elements but no data", path, t.name,
                                     numel);
    numels.push_back(numel);
    const uint64_t end = offset + numel * dt.bytes;
    header[t.name] = {{"dtype", dt.name}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();  // throws only on invalid UTF-8 in a name or metadata string
  } catch (const nlohmann::json::exception& e) {
    return Status::InvalidArgument("{}: cannot encode header: {}", path, e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // data buffer starts 8-byte aligned
  const uint64_t header_len = text.size();

  return env->WriteFileAtomically(path, [&](WritableFile* file) -> Status {
    TF_RETURN_IF_ERROR(file->Append(std::string_view(reinterpret_cast<const char*>(&header_len), 8)));
    TF_RETURN_IF_ERROR(file->Append(text));
    std::vector<uint16_t> buf;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const float* src = tensors[i].data;
      const uint64_t numel = numels[i];
      if (dtype == SafetensorsDtype::kF32) {
        if (numel > 0) {
          TF_RETURN_IF_ERROR(file->Append(std::string_view(reinterpret_cast<const char*>(src), numel * sizeof(float))));
        }
        continue;
      }
      buf.resize(kConvertChunk);
      for (uint64_t k = 0; k < numel; k += kConvertChunk) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kConvertChunk, numel - k));
        if (dtype == SafetensorsDtype::kF16) {
          for (size_t j = 0; j < n; ++j) buf[j] = FloatToHalf(src[k + j]);
        } else {
          for (size_t j = 0; j < n; ++j) buf[j] = FloatToBf16(src[k + j]);
        }
        TF_RETURN_IF_ERROR(file->Append(std::string_view(reinterpret_cast<const char*>(buf.data()), n * 2)));
      }
    }
    return Status::OK();
  });
}

Status WriteSafetensors(const std::string& path, const std::vector<const NamedTensor*>& tensors,
                        const std::map<std::string, std::string>& metadata, SafetensorsDtype dtype, Env* env) {
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NamedTensor* t = tensors[i];
    if (t == nullptr) return Status::InvalidArgument("{}: tensor #{} is null", path, i);
    uint64_t numel = 1;
    bool overflow = false;
    for (int64_t d : t->shape)
      overflow |= d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
    if (!overflow && numel != t->data.size())
      return Status::InvalidArgument("{}: tensor '{}' has {} values but its shape needs {}", path,
                                     t->name, t->data.size(), numel);
    views.push_back({t->name, t->shape, t->data.data()});  // bad shapes reported by the callee
  }
  return WriteSafetensors(path, views, metadata, dtype, env);
}

}  // namespace tf
