// Tests for base/env.h (POSIX Env, atomic whole-file writes, refusing non-regular files) and
// base/fault_env.h (injected EIO/ENOSPC, torn writes, and the simulated crash that drops what was
// not yet durable). Each test works in its own temporary directory.
#include "base/env.h"
#include "base/fault_env.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "base/byte_buffer.h"
#include "tests/test_dir.h"

namespace tf {
namespace {

namespace fs = std::filesystem;

class EnvTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string Read(const std::string& path) const {
    auto r = Env::Default()->ReadFileToString(path);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::string();
  }
  std::vector<std::string> Listing() const {
    auto r = Env::Default()->ListDir(dir_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::vector<std::string>{};
  }
  testing_util::TestDir tmp_{"tf_env"};
  std::string dir_ = tmp_.path();
};

TEST_F(EnvTest, WriteReadRoundTripAndListing) {
  Env* env = Env::Default();
  ASSERT_TRUE(env->WriteFileAtomically(Path("b.txt"), "bravo").ok());
  ASSERT_TRUE(env->WriteFileAtomically(Path("a.txt"), std::string("al\0pha", 6)).ok());
  EXPECT_EQ(Read(Path("a.txt")), std::string("al\0pha", 6));
  EXPECT_EQ(Listing(), (std::vector<std::string>{"a.txt", "b.txt"}));  // sorted, no temporaries

  auto info = env->Stat(Path("b.txt"));
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->exists && info->is_regular && !info->is_directory);
  EXPECT_EQ(info->size, 5u);
  auto missing = env->Stat(Path("nope"));
  ASSERT_TRUE(missing.ok());
  EXPECT_FALSE(missing->exists);

  auto f = env->NewRandomAccessFile(Path("b.txt"));
  ASSERT_TRUE(f.ok());
  char buf[3];
  ASSERT_TRUE((*f)->ReadExact(1, 3, buf).ok());
  EXPECT_EQ(std::string(buf, 3), "rav");
  Status past_end = (*f)->ReadExact(3, 5, buf);
  EXPECT_EQ(past_end.code(), StatusCode::kCorruption);
  EXPECT_NE(past_end.message().find("truncated"), std::string::npos) << past_end.ToString();

  auto free_space = env->FreeSpace(dir_);
  ASSERT_TRUE(free_space.ok()) << free_space.status().ToString();
  EXPECT_GT(*free_space, 0u);
}

// The open flags of the descriptor this process holds on `path` (from /proc/self/fdinfo), or -1.
long OpenFlags(const std::string& path) {
  for (const auto& fd : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(fd.path(), ec) != fs::path(path)) continue;
    std::ifstream info("/proc/self/fdinfo/" + fd.path().filename().string());
    for (std::string key; info >> key;) {
      if (key == "flags:") {
        std::string octal;
        info >> octal;
        return std::stol(octal, nullptr, 8);
      }
    }
  }
  return -1;
}

TEST_F(EnvTest, DirectWritesBypassTheCacheWhereTheyCanAndAlwaysWriteTheBytes) {
  Env* env = Env::Default();
  ByteBuffer aligned;
  std::string pattern;
  for (size_t i = 0; i < 3 * (size_t{2} << 20); ++i) pattern.push_back(static_cast<char>(i * 131 + i / 4099));
  aligned.append(pattern.data(), pattern.size());
  ASSERT_EQ(reinterpret_cast<uintptr_t>(aligned.data()) % kDirectIoAlignment, 0u);
  // Whole blocks, a tail, a file smaller than a block, nothing, and an unaligned address.
  const size_t sizes[] = {3 * kDirectIoAlignment, (size_t{2} << 20) + 123, 100, 0, 5 * kDirectIoAlignment + 1};
  for (size_t n : sizes) {
    for (size_t at : {size_t{0}, size_t{1}}) {
      const std::string_view content(aligned.data() + at, std::min(n, aligned.size() - at));
      const std::string path = Path(fmt::format("direct-{}-{}", n, at));
      ASSERT_TRUE(env->WriteFileVisible(path, content, /*direct=*/true).ok()) << path;
      EXPECT_EQ(Read(path), content) << path;
    }
  }
  EXPECT_EQ(Listing().size(), std::size(sizes) * 2);  // no temporary file left
  // On this file system (not tmpfs) the descriptor really is O_DIRECT until an unaligned tail.
  auto f = env->NewDirectWritableFile(Path("flags"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const long flags = OpenFlags(Path("flags"));
  ASSERT_NE(flags, -1);
  const bool tmpfs = fs::path(dir_).string().starts_with("/dev/shm");
  if (!tmpfs) {
    EXPECT_NE(flags & O_DIRECT, 0) << "flags " << std::oct << flags;
  }
  ASSERT_TRUE((*f)->Append(std::string_view(aligned.data(), 2 * kDirectIoAlignment + 7)).ok());
  EXPECT_EQ(OpenFlags(Path("flags")) & O_DIRECT, 0);  // the tail went through the page cache
  ASSERT_TRUE((*f)->Append("more").ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Read(Path("flags")), std::string(aligned.data(), 2 * kDirectIoAlignment + 7) + "more");
  // tmpfs has no O_DIRECT: the same call writes through the page cache.
  if (fs::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0) {
    const std::string shm = fmt::format("/dev/shm/tf_env_direct.{}", ::getpid());
    ASSERT_TRUE(env->WriteFileVisible(shm, std::string_view(aligned.data(), 3 * kDirectIoAlignment), true).ok());
    EXPECT_EQ(Read(shm), std::string_view(aligned.data(), 3 * kDirectIoAlignment));
    fs::remove(shm);
  }
}

TEST_F(EnvTest, AppendableFileAppends) {
  Env* env = Env::Default();
  for (const char* part : {"one ", "two"}) {
    auto f = env->NewAppendableFile(Path("log"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append(part).ok());
    ASSERT_TRUE((*f)->Sync().ok());
    ASSERT_TRUE((*f)->Close().ok());
    EXPECT_TRUE((*f)->Close().ok());  // idempotent
  }
  EXPECT_EQ(Read(Path("log")), "one two");
}

TEST_F(EnvTest, ReadingRefusesNonRegularFilesWithoutBlocking) {
  Env* env = Env::Default();
  const std::string fifo = Path("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Opening a FIFO with no writer would block forever with a plain open().
  auto r = env->ReadFileToString(fifo);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("FIFO"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(fifo), std::string::npos) << r.status().ToString();

  auto d = env->NewSequentialFile(dir_);
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("a directory"), std::string::npos) << d.status().ToString();

  auto missing = env->NewRandomAccessFile(Path("missing"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(Path("missing")), std::string::npos);
}

TEST_F(EnvTest, ReadFileToStringBoundsTheSize) {
  ASSERT_TRUE(Env::Default()->WriteFileAtomically(Path("big"), std::string(100, 'x')).ok());
  auto r = Env::Default()->ReadFileToString(Path("big"), 99);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("100 bytes"), std::string::npos) << r.status().ToString();
}

TEST_F(EnvTest, CreateDirsAndCheckWritableDir) {
  Env* env = Env::Default();
  ASSERT_TRUE(env->CreateDirs(Path("x/y/z")).ok());
  EXPECT_TRUE(fs::is_directory(Path("x/y/z")));
  EXPECT_TRUE(env->CreateDirs(Path("x/y/z")).ok());  // already there

  ASSERT_TRUE(env->WriteFileAtomically(Path("file"), "f").ok());
  Status under_file = env->CreateDirs(Path("file/sub"));
  EXPECT_EQ(under_file.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(under_file.message().find("not a directory"), std::string::npos) << under_file.ToString();
  Status check_file = env->CheckWritableDir(Path("file"));
  EXPECT_EQ(check_file.code(), StatusCode::kInvalidArgument) << check_file.ToString();

  ASSERT_TRUE(env->CheckWritableDir(Path("new/out")).ok());
  EXPECT_TRUE(fs::is_directory(Path("new/out")));
  EXPECT_TRUE(fs::is_empty(Path("new/out")));  // the probe is removed

  if (::geteuid() != 0) {  // root writes anywhere; the permission case is only testable as a user
    ASSERT_EQ(::chmod(Path("x").c_str(), 0500), 0);
    Status ro = env->CheckWritableDir(Path("x"));
    EXPECT_EQ(ro.code(), StatusCode::kIOError) << ro.ToString();
    EXPECT_NE(ro.message().find("not writable"), std::string::npos) << ro.ToString();
    ::chmod(Path("x").c_str(), 0700);
  }
}

TEST_F(EnvTest, ErrorsNameThePathAndErrno) {
  Status s = Env::Default()->WriteFileAtomically(Path("no/such/dir/f"), "x");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find(Path("no/such/dir/f")), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("No such file or directory"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("errno 2"), std::string::npos) << s.ToString();
  Status rm = Env::Default()->RemoveFile(Path("absent"));
  EXPECT_NE(rm.message().find(Path("absent")), std::string::npos) << rm.ToString();
}

TEST(DirNameTest, Cases) {
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("c"), ".");
  EXPECT_EQ(DirName("/c"), "/");
}

// Every way replacing a file can fail keeps the previous content and leaves no temporary behind;
// the message names the file and the errno.
TEST_F(EnvTest, FailedAtomicWriteKeepsPreviousFile) {
  const std::string p = Path("out.json");
  ASSERT_TRUE(Env::Default()->WriteFileAtomically(p, "previous").ok());
  const std::vector<std::pair<std::string, FaultOptions>> faults = {
      {"Input/output error", FaultOptions{.fail_write_at = 2}},
      {"No space left on device", FaultOptions{.enospc_after_bytes = 5}},
      {"Input/output error", FaultOptions{.fail_sync_at = 1}},
      {"Input/output error", FaultOptions{.fail_rename_at = 1}},
  };
  for (const auto& [errno_text, options] : faults) {
    FaultInjectionEnv env(Env::Default(), options);
    Status s = env.WriteFileAtomically(p, [](WritableFile* f) {
      TF_RETURN_IF_ERROR(f->Append("replace"));
      return f->Append("ment content");
    });
    ASSERT_EQ(s.code(), StatusCode::kIOError) << errno_text;
    EXPECT_NE(s.message().find(p), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find(errno_text), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("previous file, if any, is unchanged"), std::string::npos) << s.ToString();
    EXPECT_EQ(Read(p), "previous") << s.ToString();
    EXPECT_EQ(Listing(), std::vector<std::string>{"out.json"}) << s.ToString();
  }
}

TEST_F(EnvTest, EnospcTearsTheCrossingWriteAndFailsLaterOnes) {
  FaultInjectionEnv env(Env::Default(), FaultOptions{.enospc_after_bytes = 6});
  auto f = env.NewWritableFile(Path("torn"));
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append("abcd").ok());
  Status crossing = (*f)->Append("efgh");  // only "ef" fits
  EXPECT_NE(crossing.message().find("No space left on device"), std::string::npos) << crossing.ToString();
  EXPECT_NE(crossing.message().find("errno 28"), std::string::npos) << crossing.ToString();
  EXPECT_FALSE((*f)->Append("x").ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Read(Path("torn")), "abcdef");
  EXPECT_EQ(env.writes(), 3);
}

TEST_F(EnvTest, FailedWriteIsTornOrNotAsConfigured) {
  for (const bool torn : {true, false}) {
    FaultInjectionEnv env(Env::Default(), FaultOptions{.fail_write_at = 1, .torn_write = torn});
    const std::string p = Path(torn ? "torn" : "clean");
    auto f = env.NewWritableFile(p);
    ASSERT_TRUE(f.ok());
    EXPECT_FALSE((*f)->Append("12345678").ok());
    ASSERT_TRUE((*f)->Close().ok());
    EXPECT_EQ(Read(p), torn ? "1234" : "") << torn;
  }
}

TEST_F(EnvTest, ResetRestartsTheCounters) {
  FaultInjectionEnv env(Env::Default(), FaultOptions{.fail_rename_at = 1});
  ASSERT_TRUE(env.WriteFileAtomically(Path("a"), "a").code() == StatusCode::kIOError);
  ASSERT_TRUE(env.WriteFileAtomically(Path("a"), "a").ok());  // the 2nd rename succeeds
  env.Reset(FaultOptions{.fail_rename_at = 1});
  EXPECT_EQ(env.WriteFileAtomically(Path("a"), "b").code(), StatusCode::kIOError);
  EXPECT_EQ(Read(Path("a")), "a");
}

// A crash keeps exactly what was made durable: synced bytes of files whose directory entry was
// synced. Unsynced appends vanish, new files whose directory was never synced vanish.
TEST_F(EnvTest, SimulatedCrashDropsWhatWasNotDurable) {
  ASSERT_TRUE(Env::Default()->WriteFileAtomically(Path("old"), "old-").ok());  // before the Env: durable
  FaultInjectionEnv env(Env::Default());
  {
    auto f = env.NewAppendableFile(Path("old"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append("synced").ok());
    ASSERT_TRUE((*f)->Sync().ok());
    ASSERT_TRUE((*f)->Append("-lost").ok());
  }
  {
    auto f = env.NewWritableFile(Path("new-durable"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append("kept").ok());
    ASSERT_TRUE((*f)->Sync().ok());
    ASSERT_TRUE((*f)->Append(" and lost").ok());
  }
  ASSERT_TRUE(env.SyncDir(dir_).ok());
  {
    auto f = env.NewWritableFile(Path("after-syncdir"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append("x").ok());
    ASSERT_TRUE((*f)->Sync().ok());  // data synced, but its directory entry is not
  }
  EXPECT_EQ(Read(Path("old")), "old-synced-lost");
  ASSERT_TRUE(env.SimulateCrash().ok());
  EXPECT_EQ(Read(Path("old")), "old-synced");
  EXPECT_EQ(Read(Path("new-durable")), "kept");
  EXPECT_EQ(Listing(), (std::vector<std::string>{"new-durable", "old"}));
}

// A rename not followed by a directory sync is undone by a crash: the replaced file comes back.
TEST_F(EnvTest, SimulatedCrashUndoesPendingRenames) {
  ASSERT_TRUE(Env::Default()->WriteFileAtomically(Path("target"), "before").ok());
  FaultInjectionEnv env(Env::Default());
  {
    auto f = env.NewWritableFile(Path("staged"));
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append("after").ok());
    ASSERT_TRUE((*f)->Sync().ok());
  }
  ASSERT_TRUE(env.RenameFile(Path("staged"), Path("target")).ok());
  EXPECT_EQ(Read(Path("target")), "after");
  ASSERT_TRUE(env.SimulateCrash().ok());
  EXPECT_EQ(Read(Path("target")), "before");
  EXPECT_EQ(Listing(), std::vector<std::string>{"target"});  // "staged" was never durable either

  // The same sequence through WriteFileAtomically (which syncs the directory) survives the crash.
  ASSERT_TRUE(env.WriteFileAtomically(Path("target"), "atomic").ok());
  ASSERT_TRUE(env.SimulateCrash().ok());
  EXPECT_EQ(Read(Path("target")), "atomic");
  EXPECT_EQ(Listing(), std::vector<std::string>{"target"});
}

}  // namespace
}  // namespace tf
