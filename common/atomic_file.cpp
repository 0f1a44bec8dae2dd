#include "common/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "common/error.h"

namespace inferlab {

namespace fs = std::filesystem;

namespace {

// "" when `path` names a regular file or nothing; else what it is. A rename onto a device node,
// a FIFO or a socket would replace it with a regular file (as root, `--json /dev/null` replaced
// /dev/null), so such a target is refused before anything is written.
std::string not_regular(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";  // a new file (or a dangling link's target)
  if (S_ISREG(st.st_mode)) return "";
  if (S_ISDIR(st.st_mode)) return "it is a folder";
  if (S_ISCHR(st.st_mode)) return "it is a character device, not a regular file";
  if (S_ISBLK(st.st_mode)) return "it is a block device, not a regular file";
  if (S_ISFIFO(st.st_mode)) return "it is a FIFO (named pipe), not a regular file";
  if (S_ISSOCK(st.st_mode)) return "it is a socket, not a regular file";
  return "it is not a regular file";
}

// The temporary files being written, for the signal handler to remove: a fixed table, since a
// handler may not allocate or lock. A slot is 0 free, 1 being filled, 2 live.
constexpr int kSlots = 64;
char g_tmp_path[kSlots][4096];
std::atomic<int> g_tmp_state[kSlots];

void remove_temporaries_and_reraise(int sig) {
  for (int i = 0; i < kSlots; ++i)
    if (g_tmp_state[i].load() == 2) ::unlink(g_tmp_path[i]);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Once per process: SIGXFSZ (a file size limit, ulimit -f) ignored, so that the write past the
// limit fails with EFBIG and the writer's error path removes its temporary file, instead of the
// signal killing the process with the file left behind; and where SIGINT, SIGTERM and SIGHUP
// would kill the process, a handler that removes the temporary files first. Signals a program
// handles itself are left to it. (SIGKILL cannot be caught: a file it leaves has this process's
// id in its name.)
void install_signal_cleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction old {};
    if (::sigaction(SIGXFSZ, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) ::signal(SIGXFSZ, SIG_IGN);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
      struct sigaction sa {};
      sa.sa_handler = remove_temporaries_and_reraise;
      sigemptyset(&sa.sa_mask);
      ::sigaction(sig, &sa, nullptr);
    }
  });
}

// Claims a slot for `path` (-1 when all are taken: the file is still removed on every other exit).
int register_temporary(const std::string& path) {
  if (path.size() >= sizeof g_tmp_path[0]) return -1;
  for (int i = 0; i < kSlots; ++i) {
    int expected = 0;
    if (!g_tmp_state[i].compare_exchange_strong(expected, 1)) continue;
    std::memcpy(g_tmp_path[i], path.c_str(), path.size() + 1);
    g_tmp_state[i].store(2);
    return i;
  }
  return -1;
}

void release_temporary(int slot) {
  if (slot >= 0) g_tmp_state[slot].store(0);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), target_(path_) {
  // Through a symbolic link, write the file it names: renaming onto the link would replace the
  // link itself with a file.
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path_, ec))) {
    target_ = fs::weakly_canonical(path_, ec).string();
    IL_CHECK(!ec, "cannot write ", path_, ": ", ec.message());
  }
  const std::string why = not_regular(target_);
  IL_CHECK(why.empty(), "cannot write ", path_, ": ", why);
  install_signal_cleanup();
  static std::atomic<unsigned> counter{0};
  // A unique name per process and file; O_EXCL skips one left by a process killed mid-write.
  do {
    release_temporary(slot_);
    tmp_ = target_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    slot_ = register_temporary(tmp_);  // before the file exists, so that no signal can miss it
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  } while (fd_ < 0 && errno == EEXIST);
  if (fd_ < 0) {
    const int err = errno;
    release_temporary(slot_);
    fail("cannot write ", path_, ": ", std::strerror(err));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
  release_temporary(slot_);
}

void AtomicFile::write(const void* data, std::size_t n) {
  IL_CHECK(fd_ >= 0 && !committed_, "error writing ", path_, ": the file is already closed");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    IL_CHECK(w > 0, "error writing ", path_, ": ", w < 0 ? std::strerror(errno) : "no progress");
    p += w, n -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  IL_CHECK(fd_ >= 0 && !committed_, "error writing ", path_, ": the file is already closed");
  // The bytes reach the disk before the name does, so that a crash cannot leave the new name
  // on an empty file.
  IL_CHECK(::fsync(fd_) == 0, "error writing ", path_, ": ", std::strerror(errno));
  const int closed = ::close(fd_);
  fd_ = -1;
  IL_CHECK(closed == 0, "error writing ", path_, ": ", std::strerror(errno));
  const std::string why = not_regular(target_);  // it may have become one while this was written
  IL_CHECK(why.empty(), "cannot write ", path_, ": ", why);
  IL_CHECK(std::rename(tmp_.c_str(), target_.c_str()) == 0, "cannot write ", path_, ": ", std::strerror(errno));
  committed_ = true;
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes);
  f.commit();
}

namespace {

// "" when `dir` (an existing path) is a folder this process may create files in.
std::string folder_problem(const fs::path& dir) {
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (ec) return "cannot access folder " + dir.string() + ": " + ec.message();
  if (!fs::is_directory(st)) return dir.string() + " is not a folder";
  if (::access(dir.c_str(), W_OK | X_OK) != 0) return "folder " + dir.string() + " is not writable: " + std::strerror(errno);
  return "";
}

// The folder a path's file lives in: "." for a bare name.
fs::path folder_of(const fs::path& p) {
  const fs::path parent = p.parent_path();
  return parent.empty() ? fs::path(".") : parent;
}

}  // namespace

std::string unwritable_file_reason(const std::string& path) {
  if (path.empty()) return "the path is empty";
  const fs::path p(path);
  std::error_code ec;
  // Through a link, the file it names is the one written (AtomicFile): a dangling link's target.
  fs::path target = p;
  if (fs::is_symlink(fs::symlink_status(p, ec))) {
    target = fs::weakly_canonical(p, ec);
    if (ec) return ec.message();
  }
  if (std::string why = not_regular(target.string()); !why.empty()) return why;
  const fs::path dir = folder_of(target);
  if (!fs::exists(dir, ec)) return "folder " + dir.string() + " does not exist";
  return folder_problem(dir);
}

std::string unwritable_folder_reason(const std::string& path) {
  if (path.empty()) return "the path is empty";
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(path), ec);
  if (ec) return ec.message();
  // The nearest part of the path that exists: every part below it is created.
  while (!fs::exists(p, ec)) {
    if (ec) return ec.message();
    if (p == p.parent_path()) break;
    p = p.parent_path();
  }
  if (!fs::is_directory(p, ec)) return p.string() + " is a file, not a folder";
  return folder_problem(p);
}

void require_writable_file(const std::string& path, const std::string& what) {
  const std::string why = unwritable_file_reason(path);
  IL_CHECK(why.empty(), "cannot write ", what, " ", path, ": ", why);
}

void require_writable_folder(const std::string& path, const std::string& what) {
  const std::string why = unwritable_folder_reason(path);
  IL_CHECK(why.empty(), "cannot write ", what, " ", path, ": ", why);
}

void check_not_input(const std::string& output, const std::vector<std::string>& inputs) {
  std::error_code ec;
  if (!fs::exists(output, ec)) return;
  const fs::path out = fs::path(output);
  const bool out_is_dir = fs::is_directory(out);
  const fs::path out_dir = fs::absolute(out).parent_path();
  for (const std::string& in : inputs) {
    if (in.empty() || !fs::exists(in, ec)) continue;
    IL_CHECK(!fs::equivalent(out, in), "output ", output, " is ", in, ", which this command reads; write to another ",
             out_is_dir ? "folder" : "file");
    if (fs::is_directory(in)) {
      IL_CHECK(out_is_dir || !fs::equivalent(out_dir, in), "output ", output, " is a file of ", in,
               ", the folder this command reads; write it somewhere else");
    } else {
      IL_CHECK(!out_is_dir || !fs::equivalent(out, fs::absolute(in).parent_path()), "output folder ", output, " holds ", in,
               ", which this command reads; write to another folder");
    }
  }
}

}  // namespace inferlab
