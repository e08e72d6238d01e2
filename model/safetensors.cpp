// Safetensors reader/writer. Format: docs/formats.md ("Safetensors").
#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

// ---- Element conversions -------------------------------------------------------------------

float Bf16ToFloat(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN with its sign.
uint16_t FloatToBf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// IEEE binary16 -> binary32, exact (subnormals, infinities and NaN included).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);  // 112 = 127 - 15
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal: value = mant * 2^-24; normalise the mantissa.
    int e = -1;
    do {
      mant <<= 1;
      ++e;
    } while ((mant & 0x400u) == 0);
    bits = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// IEEE binary32 -> binary16, round to nearest even; overflow -> inf; NaN stays quiet NaN.
uint16_t FloatToHalf(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf (and inf itself)
  if (abs >= 0x38800000u) {                      // normal half range (>= 2^-14)
    uint32_t v = abs - (112u << 23);               // rebias exponent
    v += 0xfffu + ((v >> 13) & 1u);                // round to nearest even at bit 13
    return sign | static_cast<uint16_t>(v >> 13);  // a carry may bump into the next binade
  }
  if (abs < 0x33000000u) return sign;  // < 2^-25: rounds to zero (2^-25 itself ties to 0)
  // Subnormal half: value = m * 2^-24 with m in [1, 1023]; round m to nearest even.
  const uint32_t e = abs >> 23;                      // 102..112
  const uint32_t m = (abs & 0x7fffffu) | 0x800000u;  // 24-bit significand
  const uint32_t shift = 126u - e;                   // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | static_cast<uint16_t>(q);
}

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

// Owns a file descriptor; not copyable.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Closes and reports the close() error (which can carry a delayed write error).
  int Close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

// Reads exactly n bytes at offset; a short read means the file shrank while we read it.
Status PreadExact(int fd, const std::string& path, uint64_t offset, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("reading " + path, errno);
    }
    if (r == 0) return Status::Corruption("{}: unexpected end of file at byte {}", path, offset);
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::OK();
}

Status WriteAll(int fd, const std::string& what, const void* buf, size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("writing " + what, errno);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

// Writes <path>.tmp and renames it over <path> on Commit(); the destructor removes an
// uncommitted temporary. Not copyable.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {}
  ~AtomicFile() {
    if (!committed_ && opened_) {
      fd_.Reset();
      ::unlink(tmp_.c_str());
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status Open() {
    int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno("creating " + tmp_, errno);
    fd_.Reset(fd);
    opened_ = true;
    return Status::OK();
  }
  Status Append(const void* buf, size_t n) { return WriteAll(fd_.get(), tmp_, buf, n); }
  Status Commit() {
    if (::fsync(fd_.get()) != 0) return Status::FromErrno("fsync " + tmp_, errno);
    if (fd_.Close() != 0) return Status::FromErrno("closing " + tmp_, errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0)
      return Status::FromErrno("renaming " + tmp_ + " to " + path_, errno);
    committed_ = true;
    // Make the rename itself durable.
    const size_t slash = path_.find_last_of('/');
    const std::string dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : path_.substr(0, slash));
    Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dfd.get() < 0) return Status::FromErrno("opening directory " + dir, errno);
    if (::fsync(dfd.get()) != 0) return Status::FromErrno("fsync directory " + dir, errno);
    return Status::OK();
  }

 private:
  std::string path_, tmp_;
  Fd fd_;
  bool opened_ = false;
  bool committed_ = false;
};

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

Status ReadTensorData(int fd, const std::string& path, uint64_t data_start, const Entry& e,
                      NamedTensor* out) {
  out->data.resize(e.numel);
  const uint64_t at = data_start + e.begin;
  if (e.dtype->id == SafetensorsDtype::kF32)
    return PreadExact(fd, path, at, out->data.data(), e.numel * sizeof(float));
  std::vector<uint16_t> buf(std::min<uint64_t>(e.numel, kConvertChunk));
  for (uint64_t i = 0; i < e.numel; i += buf.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), e.numel - i));
    TF_RETURN_IF_ERROR(PreadExact(fd, path, at + i * 2, buf.data(), n * 2));
    float* dst = out->data.data() + i;
    if (e.dtype->id == SafetensorsDtype::kF16) {
      for (size_t j = 0; j < n; ++j) dst[j] = HalfToFloat(buf[j]);
    } else {
      for (size_t j = 0; j < n; ++j) dst[j] = Bf16ToFloat(buf[j]);
    }
  }
  return Status::OK();
}

}  // namespace

StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return Status::NotFound("{}: no such file", path);
    return Status::FromErrno("opening " + path, errno);
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument("{}: not a regular file", path);
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8)
    return Status::Corruption("{}: file is {} bytes, shorter than the 8-byte header length",
                              path, file_size);

  uint64_t header_len = 0;
  TF_RETURN_IF_ERROR(PreadExact(fd.get(), path, 0, &header_len, 8));
  if (header_len > kSafetensorsMaxHeaderBytes)
    return Status::Corruption("{}: header length {} exceeds the {} byte limit", path, header_len,
                              kSafetensorsMaxHeaderBytes);
  if (header_len > file_size - 8)
    return Status::Corruption("{}: header length {} runs past the end of the {} byte file", path,
                              header_len, file_size);
  std::string header(static_cast<size_t>(header_len), '\0');
  TF_RETURN_IF_ERROR(PreadExact(fd.get(), path, 8, header.data(), header.size()));

  // nlohmann keeps the last of duplicate keys; catch top-level duplicates while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t event,
                                             nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !seen.insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  nlohmann::json j = nlohmann::json::parse(header, cb, /*allow_exceptions=*/false);
  if (j.is_discarded())
    return Status::Corruption("{}: header ({} bytes) is not valid UTF-8 JSON", path, header_len);
  if (!j.is_object())
    return Status::Corruption("{}: header is a JSON {}, expected an object", path, j.type_name());
  if (!duplicate.empty())
    return Status::Corruption("{}: header names '{}' more than once", path, duplicate);

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

  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    NamedTensor t;
    t.name = e.name;
    t.shape = e.shape;
    TF_RETURN_IF_ERROR(ReadTensorData(fd.get(), path, data_start, e, &t));
    out.tensors.push_back(std::move(t));
  }
  return out;
}

Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        SafetensorsDtype dtype) {
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

  AtomicFile file(path);
  TF_RETURN_IF_ERROR(file.Open());
  TF_RETURN_IF_ERROR(file.Append(&header_len, 8));
  TF_RETURN_IF_ERROR(file.Append(text.data(), text.size()));
  std::vector<uint16_t> buf;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const float* src = tensors[i].data;
    const uint64_t numel = numels[i];
    if (dtype == SafetensorsDtype::kF32) {
      if (numel > 0) TF_RETURN_IF_ERROR(file.Append(src, numel * sizeof(float)));
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
      TF_RETURN_IF_ERROR(file.Append(buf.data(), n * 2));
    }
  }
  return file.Commit();
}

Status WriteSafetensors(const std::string& path, const std::vector<const NamedTensor*>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        SafetensorsDtype dtype) {
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
  return WriteSafetensors(path, views, metadata, dtype);
}

}  // namespace tf
