// `trainflow train`: the model and training configs (files plus --key value overrides, one per
// training config key: engine/train_config.h), the trainer, and under `trainflow launch` the
// rank's agent (heartbeats, the rescue after a failure).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/env.h"
#include "base/log.h"
#include "engine/cli/cli.h"
#include "engine/cli/command.h"
#include "engine/cli/rescue_target.h"
#include "engine/cli/test_faults.h"
#include "engine/train_config.h"
#include "engine/trainer.h"
#include "launch/rank_agent.h"
#include "model/config.h"

namespace tf {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Copies what this process writes to stdout and stderr into a log file as well (appended), from
// Start until destruction: each stream is redirected into a pipe whose reader thread passes every
// chunk on to the original stream and to the file. Not copyable; the destructor flushes both
// streams, puts them back and waits for the readers.
class ConsoleCopy {
 public:
  static std::unique_ptr<ConsoleCopy> Start(const std::string& path) {
    const auto info = Env::Default()->Stat(path);
    if (!info.ok() || (info->exists && !info->is_regular)) return nullptr;  // a FIFO or device: no copy
    auto file = Env::Default()->NewAppendableFile(path);
    if (!file.ok()) return nullptr;
    std::unique_ptr<ConsoleCopy> c(new ConsoleCopy());
    c->file_ = std::move(*file);
    std::fflush(stdout);
    std::fflush(stderr);
    for (int i = 0; i < 2; ++i) {
      Stream& st = c->streams_[i];
      st.fd = i + 1;
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0) break;
      st.saved = ::fcntl(st.fd, F_DUPFD_CLOEXEC, 3);
      st.out = st.saved >= 0 ? ::fdopen(st.saved, "w") : nullptr;
      if (st.out == nullptr || ::dup2(p[1], st.fd) < 0) {
        ::close(p[0]);
        ::close(p[1]);
        break;
      }
      ::close(p[1]);
      st.reader = std::thread([c = c.get(), &st, in = p[0]] {
        char buf[4096];
        for (;;) {
          const ssize_t n = ::read(in, buf, sizeof(buf));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          std::fwrite(buf, 1, static_cast<size_t>(n), st.out);
          std::fflush(st.out);
          std::lock_guard<std::mutex> lock(c->mu_);
          if (c->file_ && !c->file_->Append(std::string_view(buf, static_cast<size_t>(n))).ok()) c->file_.reset();
        }
        ::close(in);
      });
    }
    return c;
  }
  ConsoleCopy(const ConsoleCopy&) = delete;
  ConsoleCopy& operator=(const ConsoleCopy&) = delete;
  ~ConsoleCopy() {
    std::fflush(stdout);
    std::fflush(stderr);
    for (Stream& st : streams_) {
      if (!st.reader.joinable()) continue;
      ::dup2(st.saved, st.fd);  // closes the pipe's write end: the reader sees its end
      st.reader.join();
      std::fclose(st.out);
    }
    if (file_) (void)file_->Close();
  }

 private:
  ConsoleCopy() = default;
  struct Stream {
    int fd = -1, saved = -1;
    std::FILE* out = nullptr;  // the original stream
    std::thread reader;
  };
  std::mutex mu_;  // guards file_
  std::unique_ptr<WritableFile> file_;
  Stream streams_[2];
};


int CmdTrain(const std::string& model_path, const std::string& train_path, const std::string& init_from,
             const std::vector<std::string>& extras) {
  GPT2Config model;
  TrainConfig train;
  Status s = LoadConfigs(model_path, train_path, extras, [&](json* t) {
    if (!init_from.empty()) (*t)["init_from"] = init_from;
  }, &model, &train, init_from);
  // Under `trainflow launch`: heartbeats from start-up on, and the rescue after a failure.
  auto agent = launch::RankAgent::FromEnvironment();
  if (!agent.ok()) return Fail(agent.status());
  auto fail = [&](Trainer* t, const Status& st) {
    const int code = Fail(st);
    if (!*agent) return code;
    std::optional<TrainerRescue> target;
    if (t != nullptr) target.emplace(*t);
    const int rc = (*agent)->Linger(target ? &*target : nullptr, st, code);
    (*agent)->Finish(rc);
    // No destructors: the trainer's communicator and threads wait for peers that are gone.
    launch::QuickExit(rc);
    return rc;
  };
  if (!s.ok()) return fail(nullptr, s);
  // The default out_dir ("out", not in any file or flag) is recorded absolute like the others.
  if (std::error_code ec; !train.out_dir.empty() && !LooksLikeUrl(train.out_dir)) {
    const fs::path abs = fs::absolute(train.out_dir, ec);
    if (!ec) train.out_dir = abs.lexically_normal().string();
  }
  // out_dir/train.log: what rank 0's console shows, appended run after run (the supervisor of
  // `trainflow launch` keeps the logs of its jobs itself).
  std::unique_ptr<ConsoleCopy> console;
  if (!*agent && RankFromEnvironment() <= 0 && !train.out_dir.empty() && !LooksLikeUrl(train.out_dir) &&
      std::getenv("TRAINFLOW_LOG_FILE") == nullptr &&
      Env::Default()->CreateDirs(train.out_dir).ok()) {
    console = ConsoleCopy::Start(train.out_dir + "/train.log");
  }
  auto trainer = Trainer::Create(model, train, Trainer::Options{.faults = TestFaults()});
  if (!trainer.ok()) return fail(nullptr, trainer.status());
  auto result = (*trainer)->Run();
  if (!result.ok()) return fail(trainer->get(), result.status());
  const int rc = result->stopped ? kExitStopped : kExitOk;
  if (*agent) (*agent)->Finish(rc);
  return rc;
}

}  // namespace

Status ResolveTrainCommand(const std::vector<std::string>& args, GPT2Config* model, TrainConfig* train) {
  if (args.empty() || args[0] != "train") {
    return Status::InvalidArgument("the command to supervise must be `train ...` (after --), got '{}'",
                                   args.empty() ? "" : args[0]);
  }
  std::string model_path, train_path, init_from;
  std::vector<std::string> extras;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& a = args[i];
    const std::string flag = DashedFlag(a);  // as `trainflow train` reads it: --init_from = --init-from
    std::string* into = flag == "--model"       ? &model_path
                        : flag == "--train"     ? &train_path
                        : flag == "--init-from" ? &init_from
                                                : nullptr;
    if (into != nullptr) {
      if (i + 1 >= args.size()) return Status::InvalidArgument("train: {} has no value", a);
      *into = args[++i];
      continue;
    }
    extras.push_back(a);
  }
  return LoadConfigs(model_path, train_path, extras, [&](json* t) {
    if (!init_from.empty()) (*t)["init_from"] = init_from;
  }, model, train, init_from);
}

Command AddTrainCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model: --model M.json --train T.json [--key value overrides]");
  struct Args {
    std::string model_path, train_path, init_from;
    CLI::Option* init_opt = nullptr;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model", a->model_path,
                  "Model config JSON (configs/model/*.json); optional with --init-from weights that carry it");
  cmd->add_option("--train", a->train_path, "Training config JSON");
  a->init_opt = cmd->add_option("--init-from", a->init_from, "Start from Hugging Face GPT-2 safetensors weights");
  cmd->allow_extras();
  cmd->footer("Any training or model config key can be given as --key value (--max-steps 50 --lr 1e-3 --n-layer "
              "2; the spelling with underscores, --max_steps, is an alias; a boolean key alone means true: --fresh); "
              "every key, its default and meaning: docs/configs.md.\n" +
              ConfigKeysHelp());
  return {[cmd] { return cmd->parsed(); },
          [cmd, a] {
            if (a->init_opt->count() > 0 && a->init_from.empty()) {
              return Fail(Status::InvalidArgument("--init-from is empty: give a safetensors file, or leave the flag "
                                                  "out to start from random weights"));
            }
            return CmdTrain(a->model_path, a->train_path, a->init_from, cmd->remaining());
          }};
}

}  // namespace tf
