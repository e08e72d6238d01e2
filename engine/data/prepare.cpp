#include "engine/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>

#include "engine/data/token_file.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Inputs {
  std::vector<fs::path> files;
  int symlinks = 0;  // skipped inside directories
};

// Files of `inputs`, directories walked recursively (each level sorted by name; symbolic links and
// names starting with '.' inside directories are skipped).
StatusOr<Inputs> ListInputs(const std::vector<std::string>& inputs) {
  Inputs out;
  std::function<Status(const fs::path&)> walk = [&](const fs::path& dir) -> Status {
    std::error_code ec;
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(dir, ec)) entries.push_back(e.path());
    if (ec) return Status::IOError("cannot list directory '{}': {}", dir.string(), ec.message());
    std::sort(entries.begin(), entries.end());
    for (const fs::path& p : entries) {
      if (p.filename().string().starts_with(".")) continue;
      if (fs::is_symlink(p, ec)) {
        ++out.symlinks;
      } else if (fs::is_directory(p, ec)) {
        TF_RETURN_IF_ERROR(walk(p));
      } else if (fs::is_regular_file(p, ec)) {
        out.files.push_back(p);
      }
    }
    return Status::OK();
  };
  for (const std::string& in : inputs) {
    std::error_code ec;
    const fs::path p(in);
    if (fs::is_directory(p, ec)) {
      TF_RETURN_IF_ERROR(walk(p));
    } else if (fs::exists(fs::symlink_status(p, ec))) {
      out.files.push_back(p);  // reading refuses a FIFO, a device or a dangling link, naming it
    } else {
      return Status::NotFound("input '{}' does not exist", in);
    }
  }
  return out;
}

// A document's text cut at line ends into pieces of about `bytes` (a piece ends at the first line
// end at or after `bytes`; a line longer than that is one piece).
std::vector<std::string_view> Cut(std::string_view doc, size_t bytes) {
  std::vector<std::string_view> pieces;
  while (!doc.empty()) {
    size_t end = doc.size();
    if (doc.size() > bytes) {
      const size_t nl = doc.find('\n', bytes - 1);
      end = nl == std::string_view::npos ? doc.size() : nl + 1;
    }
    pieces.push_back(doc.substr(0, end));
    doc.remove_prefix(end);
  }
  return pieces;
}

}  // namespace

StatusOr<PrepareResult> PrepareData(const PrepareOptions& o, const Tokenizer& tokenizer, Env* env) {
  if (o.inputs.empty()) return Status::InvalidArgument("prepare: no --input given");
  if (o.out_dir.empty()) return Status::InvalidArgument("prepare: no --out-dir given");
  if (LooksLikeUrl(o.out_dir)) {
    return Status::InvalidArgument("prepare: --out-dir '{}' looks like a URL; token files go to a local directory",
                                   o.out_dir);
  }
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0)) {
    return Status::InvalidArgument("prepare: --val-fraction must be in [0, 1), got {}", o.val_fraction);
  }
  if (tokenizer.vocab_size() > 65536) {
    return Status::InvalidArgument("prepare: vocab {} does not fit uint16 token files", tokenizer.vocab_size());
  }
  TF_ASSIGN_OR_RETURN(const Inputs inputs, ListInputs(o.inputs));

  PrepareResult r;
  r.skipped_symlinks = inputs.symlinks;
  std::vector<std::string> docs;
  for (const fs::path& f : inputs.files) {
    TF_ASSIGN_OR_RETURN(std::string text, env->ReadFileToString(f.string()));
    if (text.find('\0') != std::string::npos) {  // binary (e.g. fortune's .dat index files)
      ++r.skipped_binary;
      continue;
    }
    ++r.files;
    if (!o.delimiter) {
      if (!text.empty()) docs.push_back(std::move(text));
      continue;
    }
    // A line equal to the delimiter ends a document; with "" any run of blank lines does.
    std::string doc;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      const size_t end = nl == std::string::npos ? text.size() : nl;
      std::string_view line(text.data() + pos, end - pos);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      const bool separator = o.delimiter->empty() ? line.find_first_not_of(" \t") == std::string_view::npos
                                                  : line == *o.delimiter;
      if (separator) {
        if (!doc.empty()) docs.push_back(std::move(doc));
        doc.clear();
      } else {
        doc.append(text, pos, end - pos);
        doc += '\n';
      }
      pos = end + 1;
    }
    if (!doc.empty()) docs.push_back(std::move(doc));
  }
  if (docs.empty()) return Status::InvalidArgument("prepare: the inputs contain no text documents");
  r.documents = static_cast<int64_t>(docs.size());

  // The split is by pieces: documents, with any longer than kPieceBytes cut at line ends (so one
  // file, or a few large ones, split too); with fewer than kMinPieces the cut is finer.
  struct Piece {
    size_t doc;
    std::string_view text;
  };
  constexpr size_t kPieceBytes = 16384, kMinPieces = 20;
  auto cut_all = [&](size_t bytes) {
    std::vector<Piece> pieces;
    for (size_t d = 0; d < docs.size(); ++d) {
      for (std::string_view p : Cut(docs[d], bytes)) pieces.push_back({d, p});
    }
    return pieces;
  };
  std::vector<Piece> pieces = cut_all(kPieceBytes);
  if (o.val_fraction > 0 && pieces.size() < kMinPieces) {
    size_t total = 0;
    for (const std::string& d : docs) total += d.size();
    pieces = cut_all(std::max<size_t>(1, total / kMinPieces));
  }
  // Exactly round(f * pieces) pieces (at least 1) go to validation, the first ones in the order of a
  // seeded hash of their index: deterministic, and independent of the thread count.
  std::vector<bool> is_val(pieces.size(), false);
  if (o.val_fraction > 0 && pieces.size() >= 2) {
    const size_t k = std::clamp<size_t>(static_cast<size_t>(std::llround(o.val_fraction * pieces.size())), 1,
                                        pieces.size() - 1);
    std::vector<size_t> order(pieces.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      const uint64_t ha = Mix(o.seed ^ Mix(a)), hb = Mix(o.seed ^ Mix(b));
      return ha != hb ? ha < hb : a < b;
    });
    for (size_t i = 0; i < k; ++i) is_val[order[i]] = true;
  }

  // Each split is its pieces in order; a separator (the end-of-text token, or a blank line for
  // tokenizers without one) goes before every piece that does not continue the previous one.
  std::vector<int32_t> separator;
  if (tokenizer.eot_token() >= 0) separator.push_back(tokenizer.eot_token());
  else separator = tokenizer.Encode("\n");  // documents already end in '\n': a blank line between
  std::vector<uint16_t> train, val;
  int64_t last_piece[2] = {-2, -2};
  size_t last_doc[2] = {0, 0};
  std::vector<bool> doc_in[2] = {std::vector<bool>(docs.size()), std::vector<bool>(docs.size())};
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int s = is_val[i] ? 1 : 0;
    std::vector<uint16_t>& dst = s ? val : train;
    const bool continues = last_piece[s] == static_cast<int64_t>(i) - 1 && last_doc[s] == pieces[i].doc;
    if (!continues) {
      for (int32_t id : separator) dst.push_back(static_cast<uint16_t>(id));
    }
    for (int32_t id : tokenizer.Encode(pieces[i].text)) dst.push_back(static_cast<uint16_t>(id));
    last_piece[s] = static_cast<int64_t>(i);
    last_doc[s] = pieces[i].doc;
    doc_in[s][pieces[i].doc] = true;
  }
  r.pieces = static_cast<int64_t>(pieces.size());
  r.val_pieces = std::count(is_val.begin(), is_val.end(), true);
  r.train_documents = std::count(doc_in[0].begin(), doc_in[0].end(), true);
  r.val_documents = std::count(doc_in[1].begin(), doc_in[1].end(), true);
  r.train_tokens = static_cast<int64_t>(train.size());
  r.val_tokens = static_cast<int64_t>(val.size());
  const TokenFileTokenizer record{tokenizer.name(), tokenizer.vocab_size(), tokenizer.fingerprint()};

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
  if (Status s = WriteTokenFile(staged_train, train, /*with_header=*/true, env, record); !s.ok()) return discard(s);
  if (!val.empty()) {
    if (Status s = WriteTokenFile(staged_val, val, /*with_header=*/true, env, record); !s.ok()) return discard(s);
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
  r.removed_old_val = old_val.exists && val.empty();
  TF_RETURN_IF_ERROR(env->SyncDir(o.out_dir));
  if (val.empty()) r.val_path.clear();
  return r;
}

}  // namespace tf
