#pragma once
/// @file safetensors.h
/// @brief Reading and writing safetensors files, and checkpoints made of one or many of them.
///
/// Format (https://huggingface.co/docs/safetensors): an 8-byte little-endian header length N,
/// N bytes of JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
/// (offsets relative to the byte after the header) plus an optional "__metadata__" object of
/// strings, then the data. Files are memory-mapped: get() returns a view of the mapping, so
/// loading a checkpoint reads nothing until a tensor is used. Every header entry is validated
/// on open; a bad file fails with an error that names the file and the field.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor.h"

namespace inferlab {

/// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  /// Maps `path` (`what` names its kind in errors: "GGUF file", ...); throws
  /// "cannot open <what> <path>: <reason>", also when it is not a regular file.
  MappedFile(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Where one tensor lives in a safetensors file.
struct TensorInfo {
  DType dtype;
  Shape shape;
  std::size_t begin = 0, end = 0;  ///< byte offsets in the data section
};

/// One safetensors file.
class SafetensorsFile {
 public:
  /// Opens and validates `path`.
  explicit SafetensorsFile(const std::string& path);
  const std::string& path() const { return file_->path(); }
  /// Tensor names in file order (ascending data offset).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  /// Throws "<file>: no tensor named '<name>'".
  const TensorInfo& info(const std::string& name) const;
  /// A CPU tensor viewing the mapped bytes (copied only if the file misaligns it).
  Tensor get(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::size_t data_start_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

/// Writes tensors (any device; copied to the host) to a safetensors file.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

/// The weights of a model folder: `model.safetensors`, or the shards listed in
/// `model.safetensors.index.json` ("weight_map": tensor name -> shard file). A path to a single
/// .safetensors file works too.
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path);
  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  /// All tensor names, sorted.
  std::vector<std::string> names() const;
  /// Throws "<folder>: checkpoint has no tensor '<name>'".
  Tensor get(const std::string& name) const;
  /// As get(), and throws unless the tensor has `shape`.
  Tensor get(const std::string& name, const Shape& shape) const;
  const TensorInfo& info(const std::string& name) const;
  /// The file (shard) that holds tensor `name`, for errors that name it.
  const std::string& file(const std::string& name) const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> where_;
};

/// Parses a safetensors dtype string ("F32", "BF16", ...); throws for unsupported ones.
DType parse_safetensors_dtype(const std::string& s, const std::string& context);
/// The safetensors name of a dtype.
std::string safetensors_dtype_name(DType d);

}  // namespace inferlab
