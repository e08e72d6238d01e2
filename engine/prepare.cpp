#include "engine/prepare.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/token_file.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

StatusOr<std::vector<fs::path>> ListInputs(const std::vector<std::string>& inputs) {
  std::vector<fs::path> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::path p(in);
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> entries;
      for (const auto& e : fs::directory_iterator(p, ec)) {
        if (e.is_symlink(ec) || !e.is_regular_file(ec)) continue;
        entries.push_back(e.path());
      }
      if (ec) return Status::IOError("cannot list directory '{}': {}", in, ec.message());
      std::sort(entries.begin(), entries.end());
      files.insert(files.end(), entries.begin(), entries.end());
    } else if (fs::is_regular_file(p, ec)) {
      files.push_back(p);
    } else {
      return Status::NotFound("input '{}' is not a file or directory", in);
    }
  }
  return files;
}

}  // namespace

StatusOr<PrepareResult> PrepareData(const PrepareOptions& o, const Tokenizer& tokenizer, Env* env) {
  if (o.inputs.empty()) return Status::InvalidArgument("prepare: no --input given");
  if (o.out_dir.empty()) return Status::InvalidArgument("prepare: no --out-dir given");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    return Status::InvalidArgument("prepare: --val-fraction must be in [0, 1), got {}", o.val_fraction);
  }
  if (tokenizer.vocab_size() > 65536) {
    return Status::InvalidArgument("prepare: vocab {} does not fit uint16 token files", tokenizer.vocab_size());
  }
  TF_ASSIGN_OR_RETURN(std::vector<fs::path> files, ListInputs(o.inputs));

  std::vector<std::string> docs;
  PrepareResult r;
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) return Status::IOError("cannot read '{}'", f.string());
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (text.find('\0') != std::string::npos) continue;  // binary (e.g. fortune's .dat index files)
    ++r.files;
    if (o.delimiter.empty()) {
      if (!text.empty()) docs.push_back(std::move(text));
      continue;
    }
    std::string doc;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      if (line == o.delimiter) {
        if (!doc.empty()) docs.push_back(std::move(doc));
        doc.clear();
      } else {
        doc += line;
        doc += '\n';
      }
    }
    if (!doc.empty()) docs.push_back(std::move(doc));
  }
  if (docs.empty()) return Status::InvalidArgument("prepare: the inputs contain no text documents");

  std::vector<bool> is_val(docs.size());
  const uint64_t threshold = static_cast<uint64_t>(o.val_fraction * 18446744073709551615.0);
  for (size_t i = 0; i < docs.size(); ++i) is_val[i] = o.val_fraction > 0 && Mix(o.seed ^ Mix(i)) < threshold;
  const size_t n_val = static_cast<size_t>(std::count(is_val.begin(), is_val.end(), true));
  if (o.val_fraction > 0 && docs.size() >= 2 && (n_val == 0 || n_val == docs.size())) {
    std::fill(is_val.begin(), is_val.end(), false);
    const size_t k = std::max<size_t>(1, static_cast<size_t>(o.val_fraction * docs.size()));
    for (size_t i = docs.size() - k; i < docs.size(); ++i) is_val[i] = true;
  }

  std::vector<int32_t> separator;
  if (tokenizer.eot_token() >= 0) separator.push_back(tokenizer.eot_token());
  else separator = tokenizer.Encode("\n");  // documents already end in '\n': a blank line between
  std::vector<uint16_t> train, val;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::vector<uint16_t>& dst = is_val[i] ? val : train;
    for (int32_t id : separator) dst.push_back(static_cast<uint16_t>(id));
    for (int32_t id : tokenizer.Encode(docs[i])) dst.push_back(static_cast<uint16_t>(id));
    ++(is_val[i] ? r.val_documents : r.train_documents);
  }
  r.documents = static_cast<int64_t>(docs.size());
  r.train_tokens = static_cast<int64_t>(train.size());
  r.val_tokens = static_cast<int64_t>(val.size());

  TF_RETURN_IF_ERROR(env->CreateDirs(o.out_dir));
  r.train_path = (fs::path(o.out_dir) / "train.bin").string();
  r.val_path = (fs::path(o.out_dir) / "val.bin").string();
  // The pair is replaced together: both are written in full beside the old ones first (a failure
  // there leaves the previous pair as it was), then renamed into place with the previous val.bin
  // kept aside until train.bin is in place too, and put back if that rename fails. A previous
  // val.bin is removed when this split has none, so train.bin is never paired with another run's.
  const std::string staged_train = r.train_path + ".prepare", staged_val = r.val_path + ".prepare";
  const std::string previous_val = r.val_path + ".previous";
  auto discard = [&](Status s) {
    (void)env->RemoveFile(staged_train);
    (void)env->RemoveFile(staged_val);
    return s;
  };
  if (Status s = WriteTokenFile(staged_train, train, /*with_header=*/true, env); !s.ok()) return discard(s);
  if (!val.empty()) {
    if (Status s = WriteTokenFile(staged_val, val, /*with_header=*/true, env); !s.ok()) return discard(s);
  }
  TF_ASSIGN_OR_RETURN(const FileInfo old_val, env->Stat(r.val_path));
  if (old_val.exists) {
    if (Status s = env->RenameFile(r.val_path, previous_val); !s.ok()) return discard(s);
  }
  auto restore = [&](Status s) {
    if (!val.empty()) (void)env->RemoveFile(r.val_path);
    if (old_val.exists) {
      if (Status back = env->RenameFile(previous_val, r.val_path); !back.ok()) {
        s = Status(s.code(), s.message() + fmt::format("; the previous val.bin is kept as '{}'", previous_val));
      }
    }
    return discard(s);
  };
  if (!val.empty()) {
    if (Status s = env->RenameFile(staged_val, r.val_path); !s.ok()) return restore(s);
  }
  if (Status s = env->RenameFile(staged_train, r.train_path); !s.ok()) return restore(s);
  if (old_val.exists) (void)env->RemoveFile(previous_val);
  TF_RETURN_IF_ERROR(env->SyncDir(o.out_dir));
  if (val.empty()) r.val_path.clear();
  return r;
}

}  // namespace tf
