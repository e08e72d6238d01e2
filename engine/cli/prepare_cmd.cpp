// `trainflow prepare`: text files into train.bin / val.bin token files (engine/data/prepare.h,
// docs/data.md).
#include <memory>
#include <string>

#include <fmt/format.h>

#include "engine/cli/command.h"
#include "engine/data/prepare.h"
#include "model/tokenizer.h"

namespace tf {

Command AddPrepareCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("prepare", "Tokenize text files into train.bin / val.bin token files");
  struct Args {
    PrepareOptions options;
    std::string tokenizer, tokenizer_dir, delimiter;
    CLI::Option* delimiter_opt = nullptr;
  };
  auto a = std::make_shared<Args>();
  PrepareOptions& popt = a->options;
  cmd->add_option("--input", popt.inputs, "Text files or directories (read recursively)")->required();
  cmd->add_option("--out-dir", popt.out_dir, "Output directory")->required();
  cmd->add_option("--tokenizer", a->tokenizer, "byte or gpt2")->default_str("byte");
  cmd->add_option("--tokenizer-dir", a->tokenizer_dir, kTokenizerDirHelp);
  a->delimiter_opt = cmd->add_option("--delimiter", a->delimiter,
                                     "A line equal to this separates documents (fortune files: %); \"\" = blank "
                                     "lines; default: one document per file");
  cmd->add_option("--val-fraction", popt.val_fraction,
                  "Fraction of the pieces (documents, long ones cut at ~16 KiB) for validation; 0 = none")
      ->capture_default_str();
  cmd->add_option("--seed", popt.seed, "Seed of the train/val split")->check(SeedValidator())->capture_default_str();
  return {[cmd] { return cmd->parsed(); },
          [a] {
            PrepareOptions& popt = a->options;
            std::string& tok_kind = a->tokenizer;
            if (tok_kind.empty()) tok_kind = "byte";
            if (a->delimiter_opt->count() > 0) popt.delimiter = a->delimiter;
            auto tok = MakeTokenizer(tok_kind, a->tokenizer_dir);
            if (!tok.ok()) return Fail(tok.status());
            auto r = PrepareData(popt, **tok);
            if (!r.ok()) return Fail(r.status());
            std::string skipped;
            if (r->skipped_binary > 0) skipped += fmt::format(", {} binary skipped", r->skipped_binary);
            if (r->skipped_symlinks > 0) skipped += fmt::format(", {} symbolic links skipped", r->skipped_symlinks);
            fmt::print("prepare: {} file{}{}, {} document{} in {} pieces, tokenizer {}\n", r->files,
                       r->files == 1 ? "" : "s", skipped, r->documents, r->documents == 1 ? "" : "s", r->pieces,
                       tok_kind);
            fmt::print("prepare: {}: {} tokens\n", r->train_path, r->train_tokens);
            if (!r->val_path.empty()) {
              fmt::print("prepare: {}: {} tokens ({} of {} pieces, {:.1f}% of the tokens)\n", r->val_path,
                         r->val_tokens, r->val_pieces, r->pieces,
                         100.0 * r->val_tokens / double(r->val_tokens + r->train_tokens));
            } else {
              fmt::print("prepare: no validation split ({}){}\n",
                         popt.val_fraction == 0 ? "--val-fraction 0" : "too little text to split",
                         r->removed_old_val ? "; removed the earlier val.bin, which belonged to other data" : "");
            }
            return 0;
          }};
}

}  // namespace tf
