// `trainflow prepare`: text files -> train/val token files (docs/data.md).
//
// Inputs are files or directories (walked recursively, each level sorted by name; symbolic links and
// dot-files inside directories are skipped, so aliases such as fortune's *.u8 are not read twice;
// files containing NUL bytes are skipped as binary). Documents: without a delimiter each file is one;
// with delimiter D a line equal to D separates them (fortune files use "%"); with "" blank lines do.
// The split is by pieces: every document, documents longer than 16 KiB cut at line ends into pieces
// of about 16 KiB (with fewer than 20 pieces in all, into 1/20 of the text each). Exactly
// round(val_fraction * pieces) of them (at least one, never all) go to validation, chosen by a
// seeded hash of their index — deterministic, independent of the thread count. Each split's stream
// puts the tokenizer's end-of-text token (a blank line for tokenizers without one) before every
// piece that does not continue the one before it. Both files record the tokenizer in their header.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "model/tokenizer.h"

namespace tf {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  std::optional<std::string> delimiter;  // nullopt: one document per file; "": blank lines
  double val_fraction = 0.1;
  uint64_t seed = 1337;
};

struct PrepareResult {
  int files = 0, skipped_binary = 0, skipped_symlinks = 0;
  int64_t documents = 0, train_documents = 0, val_documents = 0;  // a cut document counts in both
  int64_t pieces = 0, val_pieces = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  std::string train_path, val_path;  // val_path "" when the split has no validation
  bool removed_old_val = false;      // a val.bin of an earlier run was removed (no split this time)
};

// Writes out_dir/train.bin and val.bin (none when the split has no validation pieces) as a pair: a
// failed write leaves the previous pair intact, and a stale val.bin is removed.
StatusOr<PrepareResult> PrepareData(const PrepareOptions& options, const Tokenizer& tokenizer,
                                    Env* env = Env::Default());

}  // namespace tf
