#include "launch/state_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/json.h"

namespace tf::launch {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMaxStateBytes = uint64_t{256} << 20;

std::string StatePath(const std::string& dir) { return dir + "/state.json"; }

bool Exists(const std::string& path) {
  std::error_code e;
  return fs::symlink_status(path, e).type() != fs::file_type::not_found;
}

StatusOr<json> ReadStateFile(Env* env, const std::string& path) {
  TF_ASSIGN_OR_RETURN(json st, ReadJsonFile(path, "supervisor state", env, kMaxStateBytes));
  if (!st.is_object()) return Status::InvalidArgument("'{}' is not a supervisor state (not a JSON object)", path);
  if (!st.contains("version") || !st["version"].is_number_integer()) {
    return Status::InvalidArgument("'{}' is not a supervisor state (no version)", path);
  }
  return st;
}

}  // namespace

StateStore::StateStore(Env* env, std::string dir, bool group_readable)
    : env_(env), dir_(std::move(dir)), group_readable_(group_readable) {}

StateStore::~StateStore() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Status StateStore::Lock(int64_t pid) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return Status::IOError("cannot create the launch state directory '{}': {}", dir_, ec.message());
  // Group-readable: the setgid parent's group, kept by files created below (02750).
  ::chmod(dir_.c_str(), group_readable_ ? 02750 : 0700);
  const std::string lock = dir_ + "/lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) return Status::IOError("cannot open '{}': {}", lock, std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    std::string holder;
    std::ifstream(lock) >> holder;
    ::close(lock_fd_);
    lock_fd_ = -1;
    return Status::InvalidArgument("another supervisor (pid {}) runs the job of '{}'; `trainflow launch --status "
                                   "--state-dir {}` shows it",
                                   holder.empty() ? "?" : holder, dir_, dir_);
  }
  const std::string text = std::to_string(pid) + "\n";
  (void)!::ftruncate(lock_fd_, 0);
  (void)!::pwrite(lock_fd_, text.data(), text.size(), 0);
  return Status::OK();
}

StatusOr<std::string> StateStore::Secret(const std::string& fresh) {
  const std::string path = dir_ + "/secret";
  std::string secret;
  if (auto text = env_->ReadFileToString(path, 4096); text.ok()) {
    secret = text->substr(0, text->find_first_of(" \n"));
  }
  if (secret.size() >= 32) return secret;
  secret = fresh;
  // Owner-only from creation on (Env creates files with the umask's mode).
  const int fd = ::open((path + ".tmp").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, secret.data(), secret.size()) != static_cast<ssize_t>(secret.size()) ||
      ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    return Status::IOError("cannot write '{}'", path);
  }
  ::close(fd);
  std::error_code ec;
  fs::rename(path + ".tmp", path, ec);
  if (ec) return Status::IOError("cannot write '{}': {}", path, ec.message());
  return secret;
}

StatusOr<std::optional<json>> StateStore::LoadState() const {
  const std::string path = StatePath(dir_);
  if (!Exists(path)) return std::optional<json>();
  TF_ASSIGN_OR_RETURN(json st, ReadStateFile(env_, path));
  return std::optional<json>(std::move(st));
}

Status StateStore::SaveState(const json& state) {
  return env_->WriteFileAtomically(StatePath(dir_), state.dump(2) + "\n");
}

Status StateStore::AppendIncident(const json& record) {
  TF_ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> f, env_->NewAppendableFile(dir_ + "/incidents.jsonl"));
  TF_RETURN_IF_ERROR(f->Append(record.dump() + "\n"));
  return f->Close();
}

StatusOr<json> ReadLaunchState(Env* env, const std::string& state_dir) {
  const std::string path = StatePath(state_dir);
  if (!Exists(path)) return Status::NotFound("no launch state in '{}' (no state.json)", state_dir);
  return ReadStateFile(env, path);
}

std::vector<json> ReadIncidents(Env* env, const std::string& state_dir) {
  std::vector<json> incidents;
  if (auto text = env->ReadFileToString(state_dir + "/incidents.jsonl", kMaxStateBytes); text.ok()) {
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
      StatusOr<json> j = ParseJson(line, "incidents.jsonl", /*allow_comments=*/false);
      if (j.ok() && j->is_object()) incidents.push_back(std::move(*j));
    }
  }
  return incidents;
}

bool SupervisorRunning(const std::string& state_dir, std::string* holder) {
  std::ifstream(state_dir + "/lock") >> *holder;
  bool running = false;
  const int fd = ::open((state_dir + "/lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    running = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
    ::close(fd);
  }
  return running;
}

}  // namespace tf::launch
