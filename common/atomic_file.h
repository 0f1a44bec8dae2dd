#pragma once
/// @file atomic_file.h
/// @brief Writing a file so that it is either complete or not there at all.
///
/// Every writer (safetensors, GGUF, llama2.c checkpoints, --json, config.json) writes to a
/// temporary file beside its target and renames it into place once every byte is on disk. A
/// reader (another process, or a later run) never sees half a file, a failed or interrupted
/// write leaves the old file as it was, and a memory-mapped input stays valid even when the
/// target replaces it (the mapping keeps the old file). Writers also refuse an output that
/// is one of their inputs: writing it would destroy what they read.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace inferlab {

/// A file written under a temporary name ("<path>.tmp.<pid>.<n>") in the target's folder, so
/// that the rename stays on one file system, which makes it atomic. The target must be a regular
/// file or a new path: a device node, FIFO or socket is refused before anything is created (a
/// rename would replace it). The temporary file is removed on every exit but SIGKILL: an error,
/// SIGXFSZ (ignored from the first AtomicFile on, so that the write fails with EFBIG), and
/// SIGINT, SIGTERM or SIGHUP where the program has not set its own handler.
class AtomicFile {
 public:
  /// Creates the temporary file; throws "cannot write <path>: <reason>".
  explicit AtomicFile(std::string path);
  /// Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends bytes; throws "error writing <path>: <reason>" (a full disk, a file size limit).
  void write(const void* data, std::size_t n);
  void write(std::string_view s) { write(s.data(), s.size()); }
  /// Flushes the bytes to disk and renames the temporary file to the target.
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, target_, tmp_;  // target_: path_, or the file it links to
  int fd_ = -1, slot_ = -1;          // slot_: its entry in the table the signal handler cleans up
  bool committed_ = false;
};

/// Writes `bytes` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, std::string_view bytes);

/// Why an AtomicFile at `path` could not be written, in a few words ("folder /no/dir does not
/// exist", "it is a folder", "folder /etc is not writable: Permission denied"), or "" when it
/// can: its folder exists and is writable, and the path is not a folder. Commands check their
/// outputs with it before any work, so that a mistyped path fails at once, not after the run.
std::string unwritable_file_reason(const std::string& path);
/// The same for a folder a writer creates (with any missing parents, as
/// std::filesystem::create_directories does) and fills: "" when it is a writable folder, or
/// when the nearest folder above it that exists is writable; otherwise why not.
std::string unwritable_folder_reason(const std::string& path);
/// Throws "cannot write <what> <path>: <reason>" where unwritable_file_reason gives one.
void require_writable_file(const std::string& path, const std::string& what);
/// Throws "cannot write <what> <path>: <reason>" where unwritable_folder_reason gives one.
void require_writable_folder(const std::string& path, const std::string& what);

/// Throws unless writing `output` leaves every one of `inputs` (files or folders; "" skipped)
/// intact: `output` must not be an input, a file inside an input folder, or the folder holding
/// an input file. Existing paths are compared with std::filesystem::equivalent (so links and
/// "./x" are seen through); an output that does not exist yet cannot be any of them.
void check_not_input(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace inferlab
