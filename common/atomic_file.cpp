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
      IL_CHECK(!out_is_dir || !fs::equivalent(out, fs::absolute(in).parent_path()), "output folder ", output,
               " holds ", in, ", which this command reads; write to another folder");
    }
  }
}

}  // namespace inferlab
