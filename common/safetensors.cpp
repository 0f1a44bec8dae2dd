#include "common/safetensors.h"

#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/input_file.h"
#include "common/json_file.h"

namespace inferlab {

namespace fs = std::filesystem;
using nlohmann::json;

MappedFile::MappedFile(const std::string& path, const std::string& what) : path_(path) {
  require_regular_file(path, what);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  IL_CHECK(fd >= 0, "cannot open ", what, " ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot open ", what, " ", path, ": not a regular file");  // replaced since the check above
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    IL_CHECK(p != MAP_FAILED, "cannot map ", path, ": ", std::strerror(err));
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

DType parse_safetensors_dtype(const std::string& s, const std::string& context) {
  if (s == "F32") return DType::F32;
  if (s == "F64") return DType::F64;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I8") return DType::I8;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  fail(context, ": dtype '", s, "' is not supported (supported: F32, F64, F16, BF16, I8, I32, I64, U8)");
}

std::string safetensors_dtype_name(DType d) {
  switch (d) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I8: return "I8";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  fail("unknown dtype");
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(std::make_shared<MappedFile>(path, "safetensors file")) {
  const std::size_t size = file_->size();
  IL_CHECK(size >= 8, path, ": ", size, " bytes is too short for a safetensors file (the header length alone is 8)");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file_->data()[i];  // little-endian
  IL_CHECK(n <= size - 8, path, ": header length ", n, " runs past the end of the file (", size,
           " bytes); the file is truncated or not safetensors");
  IL_CHECK(n <= (100u << 20), path, ": header length ", n, " is above safetensors' 100 MB limit");
  data_start_ = 8 + n;
  const std::size_t data_size = size - data_start_;

  json header;
  try {
    header = json::parse(file_->data() + 8, file_->data() + 8 + n);
  } catch (const json::exception& e) {
    fail(path, ": header is not valid JSON: ", e.what());
  }
  IL_CHECK(header.is_object(), path, ": header must be a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      IL_CHECK(e.is_object(), path, ": __metadata__ must be an object of strings");
      for (auto m = e.begin(); m != e.end(); ++m) {
        IL_CHECK(m.value().is_string(), path, ": __metadata__ field '", m.key(), "' must be a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string ctx = path + ": tensor '" + name + "'";
    IL_CHECK(e.is_object(), ctx, ": entry must be an object");
    // "missing field" only when it is missing; a field of the wrong type is named with its value.
    const JsonFields f(e, ctx);
    const std::string dtype = f.get<std::string>("dtype");
    f.array("shape");
    IL_CHECK(f.array("data_offsets").size() == 2, ctx, ": field 'data_offsets' must be [begin, end], got ",
             json_brief(e["data_offsets"]));
    TensorInfo info;
    info.dtype = parse_safetensors_dtype(dtype, ctx);
    const std::string shape_ctx = ctx + ": shape " + e["shape"].dump();
    std::int64_t numel = 1;
    for (const json& d : e["shape"]) {
      IL_CHECK(d.is_number_unsigned() && d.get<std::uint64_t>() <= static_cast<std::uint64_t>(INT64_MAX), ctx,
               ": field 'shape' must hold non-negative 64-bit integers, got ", d.dump());
      info.shape.push_back(d.get<std::int64_t>());
      numel = checked_mul(numel, info.shape.back(), shape_ctx.c_str());
    }
    for (const json& o : e["data_offsets"])
      IL_CHECK(o.is_number_unsigned(), ctx, ": field 'data_offsets' must hold non-negative integers, got ", o.dump());
    info.begin = e["data_offsets"][0].get<std::size_t>();
    info.end = e["data_offsets"][1].get<std::size_t>();
    IL_CHECK(info.begin <= info.end, ctx, ": data_offsets [", info.begin, ", ", info.end, "] run backwards");
    IL_CHECK(info.end <= data_size, ctx, ": data_offsets end ", info.end, " is past the end of the data section (",
             data_size, " bytes); the file is truncated or corrupt");
    const auto want =
        static_cast<std::size_t>(checked_mul(numel, static_cast<std::int64_t>(dtype_size(info.dtype)), shape_ctx.c_str()));
    IL_CHECK(info.end - info.begin == want, ctx, ": data_offsets hold ", info.end - info.begin, " bytes but ", dtype,
             shape_str(info.shape), " needs ", want);
    infos_[name] = info;
    names_.push_back(name);
  }
  std::sort(names_.begin(), names_.end(), [&](const std::string& a, const std::string& b) {
    return infos_[a].begin < infos_[b].begin || (infos_[a].begin == infos_[b].begin && a < b);
  });
  for (std::size_t i = 1; i < names_.size(); ++i)
    IL_CHECK(infos_[names_[i]].begin >= infos_[names_[i - 1]].end, path, ": tensors '", names_[i - 1], "' and '", names_[i],
             "' overlap");
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  IL_CHECK(it != infos_.end(), path(), ": no tensor named '", name, "'");
  return it->second;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& i = info(name);
  const unsigned char* p = file_->data() + data_start_ + i.begin;
  if (reinterpret_cast<std::uintptr_t>(p) % dtype_size(i.dtype) != 0) {
    // A header length that is not a multiple of 8 misaligns the data; copy rather than read
    // misaligned floats.
    return with_context(path() + ": tensor '" + name + "'", [&] {
      Tensor t = Tensor::empty(i.shape, i.dtype);
      std::memcpy(t.raw_data(), p, i.end - i.begin);
      return t;
    });
  }
  return Tensor::wrap(const_cast<unsigned char*>(p), i.shape, i.dtype, Device::CPU, file_);
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::size_t offset = 0;
  std::vector<Tensor> host;
  for (const auto& [name, t] : tensors) {
    IL_CHECK(name != "__metadata__", path, ": '__metadata__' is not a valid tensor name");
    IL_CHECK(!header.contains(name), path, ": tensor name '", name, "' appears twice");
    Tensor h = t.is_cuda() ? t.to(Device::CPU) : t.contiguous();
    header[name] = {
        {"dtype", safetensors_dtype_name(h.dtype())}, {"shape", h.shape()}, {"data_offsets", {offset, offset + h.nbytes()}}};
    offset += h.nbytes();
    host.push_back(h);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  AtomicFile out(path);
  unsigned char len[8];
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(len, 8);
  out.write(text);
  for (const Tensor& h : host) out.write(h.raw_data(), h.nbytes());
  out.commit();
}

Checkpoint::Checkpoint(const std::string& path) : path_(path) {
  IL_CHECK(fs::exists(path), "cannot open checkpoint ", path, ": no such file or folder");
  if (!fs::is_directory(path)) {  // a FIFO or device too: SafetensorsFile refuses it by name
    files_.push_back(std::make_unique<SafetensorsFile>(path));
  } else {
    const fs::path dir(path);
    const fs::path index = dir / "model.safetensors.index.json";
    if (fs::exists(index)) {
      const json j = load_json(index.string());
      const json& weight_map = JsonFields(j, index.string()).object("weight_map");
      std::map<std::string, const SafetensorsFile*> opened;
      for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
        IL_CHECK(it.value().is_string(), index.string(), ": weight_map entry '", it.key(), "' must be a file name");
        const std::string shard = it.value().get<std::string>();
        if (!opened.count(shard)) {
          files_.push_back(std::make_unique<SafetensorsFile>((dir / shard).string()));
          opened[shard] = files_.back().get();
        }
        IL_CHECK(opened[shard]->contains(it.key()), index.string(), ": weight_map puts '", it.key(), "' in ", shard,
                 ", which has no such tensor");
        where_[it.key()] = opened[shard];
      }
      return;
    }
    const fs::path single = dir / "model.safetensors";
    IL_CHECK(fs::exists(single), path, ": no model.safetensors or model.safetensors.index.json in this folder");
    files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
  }
  for (const auto& f : files_)
    for (const auto& n : f->names()) where_[n] = f.get();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : where_) out.push_back(n);
  return out;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = where_.find(name);
  IL_CHECK(it != where_.end(), path_, ": checkpoint has no tensor '", name, "'");
  return it->second->info(name);
}

const std::string& Checkpoint::file(const std::string& name) const {
  auto it = where_.find(name);
  IL_CHECK(it != where_.end(), path_, ": checkpoint has no tensor '", name, "'");
  return it->second->path();
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  IL_CHECK(it != where_.end(), path_, ": checkpoint has no tensor '", name, "'");
  return it->second->get(name);
}

Tensor Checkpoint::get(const std::string& name, const Shape& shape) const {
  Tensor t = get(name);
  IL_CHECK(t.shape() == shape, file(name), ": tensor '", name, "' has shape ", shape_str(t.shape()), ", expected ",
           shape_str(shape));
  return t;
}

}  // namespace inferlab
