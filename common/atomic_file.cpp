#include "common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/error.h"

namespace inferlab {

namespace fs = std::filesystem;

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), target_(path_) {
  // Through a symbolic link, write the file it names: renaming onto the link would replace the
  // link itself with a file.
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(path_, ec))) {
    target_ = fs::weakly_canonical(path_, ec).string();
    IL_CHECK(!ec, "cannot write ", path_, ": ", ec.message());
  }
  static std::atomic<unsigned> counter{0};
  // A unique name per process and file; O_EXCL skips one left by a process killed mid-write.
  do {
    tmp_ = target_ + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  } while (fd_ < 0 && errno == EEXIST);
  IL_CHECK(fd_ >= 0, "cannot write ", path_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
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
  const auto st = fs::status(target, ec);
  if (fs::is_directory(st)) return "it is a folder";
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
