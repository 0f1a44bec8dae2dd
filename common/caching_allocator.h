#pragma once
/// @file caching_allocator.h
/// @brief Keeps freed device blocks for reuse, so a decode loop stops calling the device allocator.
///
/// A forward pass allocates the same tensors every step. On a GPU each cudaFree synchronises the
/// device, and a CUDA graph cannot capture cudaMalloc at all. This allocator keeps a freed block
/// in a list by its rounded size and hands it to the next request of that size, so after the
/// first step a decode loop allocates nothing from the device. It is plain C++ over two
/// functions (the device's malloc and free), so it is tested on the CPU.
///
/// Reuse is safe because all device work runs on one stream: a block freed while queued kernels
/// still read it is only handed to work queued after them.

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace inferlab {

class CachingAllocator {
 public:
  using Malloc = std::function<void*(std::size_t)>;  ///< throws when out of memory
  using Free = std::function<void(void*)>;
  CachingAllocator(Malloc malloc, Free free);

  /// A block of at least `bytes`: a cached one of the same rounded size, or a new one. When the
  /// device is out of memory, the cached blocks are given back and the request tried once more.
  void* allocate(std::size_t bytes);
  /// Takes a block back into the cache (nullptr is fine). Throws for a pointer it did not give.
  void release(void* p);
  /// Gives every cached (free) block back to the device.
  void empty_cache();

  /// Sizes are rounded up to a multiple of 512 bytes, and of 2 MiB from 1 MiB on, so that
  /// requests of nearly the same size share blocks.
  static std::size_t rounded(std::size_t bytes);

  struct Stats {
    std::size_t in_use_bytes = 0;        ///< handed out and not released
    std::size_t cached_bytes = 0;        ///< free, kept for reuse
    std::size_t device_allocations = 0;  ///< calls to the device's malloc so far
  };
  Stats stats() const;

 private:
  Malloc malloc_;
  Free free_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> cached_;  // rounded size -> free blocks
  std::unordered_map<void*, std::size_t> in_use_;     // block -> rounded size
  Stats stats_;
};

}  // namespace inferlab
