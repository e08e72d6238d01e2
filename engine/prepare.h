// `trainflow prepare`: text files -> train/val token files (docs/data.md).
//
// Inputs are files or directories (a directory contributes its regular files, sorted by name;
// symbolic links inside directories are skipped so aliases such as fortune's *.u8 are not read
// twice; files containing NUL bytes are skipped as binary). With a delimiter, a line equal to it
// separates documents (fortune files use "%"); otherwise each file is one document. Each document
// goes to validation when a hash of (seed, document index) falls under val_fraction — deterministic
// and independent of the thread count; if that leaves either split empty, the last documents go to
// validation. Documents are separated in the stream by the tokenizer's end-of-text token, or by a
// blank line for tokenizers without one.
#pragma once
#include <string>
#include <vector>

#include "base/env.h"
#include "base/status.h"
#include "model/tokenizer.h"

namespace tf {

struct PrepareOptions {
  std::vector<std::string> inputs;
  std::string out_dir;
  std::string delimiter;  // "" = one document per file
  double val_fraction = 0.1;
  uint64_t seed = 1337;
};

struct PrepareResult {
  int files = 0;
  int64_t documents = 0, train_documents = 0, val_documents = 0;
  int64_t train_tokens = 0, val_tokens = 0;
  std::string train_path, val_path;
};

// Writes out_dir/train.bin and val.bin (none when the split has no validation documents) as a
// pair: a failed write leaves the previous pair intact, and a stale val.bin is removed.
StatusOr<PrepareResult> PrepareData(const PrepareOptions& options, const Tokenizer& tokenizer,
                                    Env* env = Env::Default());

}  // namespace tf
