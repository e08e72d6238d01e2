// Safetensors reader and writer (generic: knows nothing about GPT-2 or parameter names).
// Format: docs/formats.md, "Safetensors" (an 8-byte little-endian u64 header length, a UTF-8 JSON
// header of {"dtype", "shape", "data_offsets"} per tensor plus optional "__metadata__", then the
// data buffer, which the tensors must cover exactly).
//
// Reading accepts F32, F16 and BF16 and always returns float32 in memory. Writing produces F32
// (default), F16 or BF16, with the header padded with spaces so the data buffer starts at a
// multiple of 8 bytes. Files are written atomically (Env::WriteFileAtomically), so a crash or a
// full disk never leaves a half-written file under the final name.
// Errors (never exits, never throws): a missing file is NotFound; a file whose bytes do not
// follow the format is Corruption; a well-formed file using a dtype this reader does not convert
// (F64, I32, ...) is InvalidArgument; OS failures are IOError. Every message names the file and,
// where there is one, the tensor and the field.
// Thread safety: the functions share no state; concurrent calls on different paths are safe.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"

namespace tf {

// One tensor, owning its float32 values in row-major order. data.size() == prod(shape)
// (a scalar has shape {} and one value).
struct NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// A borrowed tensor for writing without copying. `data` must point at prod(shape) floats that
// stay alive and unchanged for the duration of the WriteSafetensors call (may be null only when
// prod(shape) == 0).
struct TensorView {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

struct SafetensorsContents {
  // In data-buffer order (ascending data_offsets; ties, which only zero-sized tensors can
  // have, broken by name). For files written by WriteSafetensors this is the writing order.
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"; empty when absent
};

// On-disk element type used when writing.
enum class SafetensorsDtype { kF32, kF16, kBF16 };

// Largest header ReadSafetensors accepts (the reference implementation uses the same cap).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Reads and fully validates a file, converting F32 / F16 / BF16 tensors to float32.
StatusOr<SafetensorsContents> ReadSafetensors(const std::string& path, Env* env = Env::Default());
// The "__metadata__" strings of a file whose header validates as ReadSafetensors' does; the tensor
// data is not read.
StatusOr<std::map<std::string, std::string>> ReadSafetensorsMetadata(const std::string& path,
                                                                     Env* env = Env::Default());

// Writes `tensors` in the given order, converting to `dtype` (F16/BF16: round to nearest even;
// F16 overflows to +-inf). REQUIRES for OK: names non-empty, unique, not "__metadata__";
// shape dims >= 0; data non-null when prod(shape) > 0. Violations are InvalidArgument and
// leave nothing on disk.
Status WriteSafetensors(const std::string& path, const std::vector<TensorView>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        SafetensorsDtype dtype = SafetensorsDtype::kF32, Env* env = Env::Default());
// Same, for owned tensors; also REQUIRES data.size() == prod(shape). Pointers must be non-null.
Status WriteSafetensors(const std::string& path, const std::vector<const NamedTensor*>& tensors,
                        const std::map<std::string, std::string>& metadata,
                        SafetensorsDtype dtype = SafetensorsDtype::kF32, Env* env = Env::Default());
// Lets callers write WriteSafetensors(path, {&a, &b}, meta): without it a braced list of
// NamedTensor* is ambiguous (std::vector<TensorView> has an iterator-pair constructor).
inline Status WriteSafetensors(const std::string& path,
                               std::initializer_list<const NamedTensor*> tensors,
                               const std::map<std::string, std::string>& metadata,
                               SafetensorsDtype dtype = SafetensorsDtype::kF32) {
  return WriteSafetensors(path, std::vector<const NamedTensor*>(tensors), metadata, dtype);
}

}  // namespace tf
