#include "engine/observers.h"

#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "base/json.h"
#include "engine/monitoring.h"
#include "model/config.h"
#include "monitor/system_metrics.h"

namespace tf {
namespace {

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

// Printable form of sampled text: keeps newlines, replaces other control bytes.
std::string Printable(const std::string& s) {
  std::string out;
  for (unsigned char ch : s) {
    if (ch == '\n' || ch == '\t' || ch >= 0x20) out += static_cast<char>(ch);
    else out += '?';
  }
  return out;
}

bool PrintsHere(const Trainer& t) { return t.options().print_progress && t.topology().rank == 0; }

class EvalObserver final : public StepObserver {
 public:
  Status OnStart(Trainer& t) override {
    // Step 0 when evaluations are periodic; and once now when no step is left to run (this is the
    // end of the run: --max_steps 0 evaluates the initial weights once).
    const bool periodic = t.config().eval_interval > 0 && t.step() == 0;
    if (periodic || t.step() >= t.config().max_steps) return Evaluate(t, nullptr);
    return Status::OK();
  }
  Status OnStep(Trainer& t, StepStats& s) override {
    if (s.interrupted) return Status::OK();
    const int every = t.config().eval_interval;
    if (s.last || (every > 0 && s.step % every == 0)) return Evaluate(t, &s);
    return Status::OK();
  }

 private:
  Status Evaluate(Trainer& t, StepStats* s) {
    const DataLoader* val = t.val_data();
    if (val == nullptr || t.config().eval_batches == 0) return Status::OK();
    TF_ASSIGN_OR_RETURN(const float v, t.Evaluate(*val, t.config().eval_batches));
    t.result().val_losses.emplace_back(t.step(), v);
    if (s != nullptr) s->val_loss = v;
    if (PrintsHere(t)) {
      fmt::print("eval  step {:>5} | val loss {:.4f} (ppl {:.2f})\n", t.step(), v, std::exp(v));
      std::fflush(stdout);
    }
    return Status::OK();
  }
};

class SampleObserver final : public StepObserver {
 public:
  Status OnStep(Trainer& t, StepStats& s) override {
    if (s.interrupted || t.config().sample_tokens == 0) return Status::OK();
    const int every = t.config().sample_interval;
    if (!s.last && !(every > 0 && s.step % every == 0)) return Status::OK();
    TF_RETURN_IF_ERROR(t.PrepareSampling());
    if (t.has_tokenizer()) {
      auto text = t.SampleText();
      const std::string shown = text.ok() ? *text : "(sampling failed: " + text.status().ToString() + ")";
      if (text.ok()) t.result().samples.emplace_back(t.step(), *text);
      if (PrintsHere(t)) {
        fmt::print("sample step {:>5} ----------------------------------------\n{}\n"
                   "--------------------------------------------------------\n",
                   t.step(), Printable(shown));
        std::fflush(stdout);
      }
    }
    // Rank 0 alone samples; the others wait for it (not at the end: nothing follows but outputs).
    return s.last ? Status::OK() : t.WaitForRankZero();
  }
};

class ProgressObserver final : public StepObserver {
 public:
  Status OnStart(Trainer& t) override {
    const GPT2Config& m = t.model_config();
    const TrainConfig& c = t.config();
    fmt::print("model: {} layers, {} heads, {} embd, vocab {} (padded {}), {} parameters; tokenizer {}\n", m.n_layer,
               m.n_head, m.n_embd, m.vocab_size, m.padded_vocab_size, FormatParameterCount(NumParameters(m)),
               c.tokenizer == "auto" ? "unknown (no samples)" : c.tokenizer);
    fmt::print("device: {}\n", t.backend().Describe());
    fmt::print("state per rank (zero_stage {}): {}\n", c.zero_stage, t.state_bytes_line());
    if (t.data_parallel()) {
      fmt::print("data parallel: {}\n", t.topology().Describe());
      for (const std::string& line : t.rank_devices()) fmt::print("  {}\n", line);
      const auto& buckets = t.gradient_sync().buckets();
      if (t.backend().gradient_buffer().on_device) {
        fmt::print("gradient reduction: on the GPU, compression {} ({})\n", t.compression(), t.compression_reason());
      } else if (c.zero_stage >= 1) {
        fmt::print("gradient reduction: compression {} ({})\n", t.compression(), t.compression_reason());
      } else if (!buckets.empty()) {
        fmt::print("gradient reduction: {} bucket{} (first {:.2f} MiB, then up to {:.2f} MiB), compression {} ({})\n",
                   buckets.size(), buckets.size() == 1 ? "" : "s", buckets.front().size() * 4 / double(1 << 20),
                   c.bucket_mb, t.compression(), t.compression_reason());
      }
    }
    const int world = t.topology().world;
    fmt::print("train: {} steps x {} tokens (B={}, T={}, accum={}, ranks={}); data {} tokens, val {} tokens\n",
               c.max_steps, c.tokens_per_step() * world, c.batch_size, c.seq_len, c.grad_accum_steps, world,
               t.train_data().num_tokens(), t.val_data() ? t.val_data()->num_tokens() : 0);
    if (const DataLoader* val = t.val_data(); val != nullptr && c.eval_batches > 0) {
      // Evaluation reads its batches from the start of the file; a short file wraps around.
      const int64_t reads = int64_t{c.eval_batches} * world * c.batch_size * c.seq_len + 1;
      if (val->num_tokens() < reads) {
        spdlog::warn("{} holds {} tokens, but each evaluation reads {} ({} batches of {} x {} on each of {} rank{}): "
                     "it reads parts of the file more than once; lower eval_batches or use more validation data",
                     val->name(), val->num_tokens(), reads, c.eval_batches, c.batch_size, c.seq_len, world,
                     world == 1 ? "" : "s");
      }
    }
    if (!t.resumed_from().empty()) fmt::print("{}\n", t.resumed_from());
    std::fflush(stdout);
    first_ = t.step();
    return Status::OK();
  }
  Status OnStep(Trainer& t, StepStats& s) override {
    const int64_t max_steps = t.config().max_steps;
    // The first step of a process includes warm-up: the ETA starts from the second.
    ema_ms_ = s.step <= first_ + 2 ? s.ms : 0.9 * ema_ms_ + 0.1 * s.ms;
    if ((s.step - 1) % t.config().log_interval == 0 || s.last || s.stopping) {
      std::string comm;
      if (t.data_parallel()) {
        comm = fmt::format(" | comm {:.0f} ms exposed, {:.1f} MB sent", s.comm_exposed_ms, s.wire_bytes / 1e6);
        if (s.comm_ms > 0) comm += fmt::format(" at {:.2f} GB/s", s.wire_bytes / (s.comm_ms * 1e6));
      }
      fmt::print("step {:>5}/{} | loss {:.4f} | lr {:.2e} | norm {:.4f} | {:>8.0f} tok/s | {:>7.1f} ms{} | ETA {}\n",
                 s.step, max_steps, s.loss, s.lr, s.grad_norm, s.tokens_per_s, s.ms, comm,
                 FormatDuration(ema_ms_ * static_cast<double>(max_steps - s.step) / 1000.0));
      std::fflush(stdout);
    }
    if (s.stopping) {
      fmt::print("stopping after step {} of {} ({}); writing the outputs and {}\n", s.step, max_steps,
                 s.interrupted ? "a stop was requested: SIGINT, SIGTERM or a peer" : "stop_at_step",
                 t.config().checkpoint_dir.empty() ? "the training state" : "a checkpoint");
      std::fflush(stdout);
    }
    return Status::OK();
  }

 private:
  int64_t first_ = 0;
  double ema_ms_ = 0.0;
};

class MetricsJsonlObserver final : public StepObserver {
 public:
  explicit MetricsJsonlObserver(std::string path) : path_(std::move(path)) {}
  Status OnStart(Trainer& t) override {
    peak_ = PeakTflops(t.config(), t.backend().Describe());
    if (peak_) *peak_ *= 1e12;
    flops_per_token_ = FlopsPerToken(t.model_config(), t.config().seq_len);
    // A run from step 0 starts the file afresh; a resumed run continues it, without the records of
    // steps after the resumed one (a run that went on past its saved state and then died).
    if (t.step() > 0) TF_RETURN_IF_ERROR(KeepStepsUpTo(t.env(), t.step()).WithContext("metrics.jsonl"));
    auto f = t.step() == 0 ? t.env()->NewWritableFile(path_) : t.env()->NewAppendableFile(path_);
    if (!f.ok()) return f.status().WithContext("metrics.jsonl");
    file_ = std::move(f).value();
    // The evaluation of the initial weights (the evaluation observer runs first) has no step record.
    const auto& vals = t.result().val_losses;
    if (!vals.empty() && vals.back().first == t.step()) {
      return Append(Dump({{"event", "eval"},
                          {"step", t.step()},
                          {"val_loss", vals.back().second},
                          {"message", fmt::format("validation loss {:.4f} before training", vals.back().second)}}));
    }
    return Status::OK();
  }
  Status OnStep(Trainer& t, StepStats& s) override {
    if (!file_) return Status::OK();
    nlohmann::json line{{"step", s.step},
                        {"loss", s.loss},
                        {"lr", s.lr},
                        {"grad_norm", s.grad_norm},
                        {"ms", s.ms},
                        {"tokens_per_s", s.tokens_per_s},
                        {"data_ms", s.data_ms},
                        {"compute_ms", s.compute_ms},
                        {"optimizer_ms", s.optimizer_ms},
                        {"rss_bytes", monitor::ResidentBytes()},
                        {"peak_rss_bytes", monitor::PeakResidentBytes()}};
    if (peak_) line["mfu"] = flops_per_token_ * s.tokens_per_s / (*peak_ * t.topology().world);
    if (t.data_parallel()) {
      line["comm_exposed_ms"] = s.comm_exposed_ms;
      line["comm_ms"] = s.comm_ms;
      line["codec_ms"] = s.codec_ms;
      line["wire_bytes"] = s.wire_bytes;
      if (s.comm_ms > 0) line["comm_GBps"] = s.wire_bytes / (s.comm_ms * 1e6);  // achieved, inside collectives
    }
    if (s.val_loss) line["val_loss"] = *s.val_loss;
    if (s.checkpoint_stall_ms > 0) line["checkpoint_stall_ms"] = s.checkpoint_stall_ms;
    if (s.update_skipped) line["update_skipped"] = true;
    std::string text = Dump(line);
    if (s.anomaly) {
      text += Dump({{"event", "anomaly"},
                    {"step", s.step},
                    {"kind", s.anomaly->kind},
                    {"action", AnomalyActionName(s.anomaly->action)},
                    {"value", s.anomaly->value},
                    {"message", s.anomaly->Describe(s.step)}});
    }
    return Append(text);
  }
  Status OnRollback(Trainer& t, int64_t from, int64_t to) override {
    if (!file_) return Status::OK();
    return Append(Dump({{"event", "rollback"},
                        {"step", from},
                        {"to_step", to},
                        {"message", fmt::format("anomaly at step {}: rolled back to the checkpoint of step {}, "
                                                "skipping {} steps of data",
                                                from, to, from - to)}}));
  }
  Status OnEnd(Trainer& t, const TrainResult&) override {
    if (!file_) return Status::OK();
    Status s = file_->Sync();
    if (s.ok()) s = file_->Close();
    file_.reset();
    return s;
  }

 private:
  // One write per step: the line is on disk (in the page cache) when the step's observers finish.
  // A failing write stops the metrics, not the training: it is reported once, with the errno.
  Status Append(const std::string& text) {
    if (Status s = file_->Append(text); !s.ok()) {
      spdlog::error("{}; metrics.jsonl is incomplete from here on, training continues", s.message());
      file_.reset();
    }
    return Status::OK();
  }

  // Rewrites the file (atomically) with only its whole records of steps <= `step`.
  Status KeepStepsUpTo(Env* env, int64_t step) {
    TF_ASSIGN_OR_RETURN(const FileInfo info, env->Stat(path_));
    if (!info.exists) return Status::OK();
    TF_ASSIGN_OR_RETURN(const std::string text, env->ReadFileToString(path_));
    std::string kept;
    bool dropped = false;
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = text.find('\n', pos);
      if (end == std::string::npos) {  // a torn last line
        dropped = true;
        break;
      }
      const std::string_view line(text.data() + pos, end - pos);
      const StatusOr<nlohmann::json> parsed = ParseJson(line, "metrics line", /*allow_comments=*/false);
      const nlohmann::json record = parsed.ok() ? *parsed : nlohmann::json();
      const bool keep = record.is_object() && record.contains("step") && record["step"].is_number_integer() &&
                        record["step"].get<int64_t>() <= step;
      if (keep) kept.append(line).push_back('\n');
      else dropped = true;
      pos = end + 1;
    }
    return dropped ? env->WriteFileAtomically(path_, kept) : Status::OK();
  }

  // One JSON line (a non-finite number is written as null; invalid UTF-8 replaced).
  static std::string Dump(const nlohmann::json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }

  std::string path_;
  std::unique_ptr<WritableFile> file_;
  std::optional<double> peak_;  // FLOP/s per rank, for "mfu"
  double flops_per_token_ = 0;
};

}  // namespace

std::unique_ptr<StepObserver> MakeEvalObserver() { return std::make_unique<EvalObserver>(); }
std::unique_ptr<StepObserver> MakeSampleObserver() { return std::make_unique<SampleObserver>(); }
std::unique_ptr<StepObserver> MakeProgressObserver() { return std::make_unique<ProgressObserver>(); }
std::unique_ptr<StepObserver> MakeMetricsJsonlObserver(std::string path) {
  return std::make_unique<MetricsJsonlObserver>(std::move(path));
}

}  // namespace tf
