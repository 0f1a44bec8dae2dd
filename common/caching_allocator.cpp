#include "common/caching_allocator.h"

#include "common/error.h"

namespace inferlab {

CachingAllocator::CachingAllocator(Malloc malloc, Free free) : malloc_(std::move(malloc)), free_(std::move(free)) {}

std::size_t CachingAllocator::rounded(std::size_t bytes) {
  const std::size_t unit = bytes < (std::size_t(1) << 20) ? 512 : std::size_t(2) << 20;
  return bytes == 0 ? unit : (bytes + unit - 1) / unit * unit;
}

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = rounded(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  if (auto it = cached_.find(size); it != cached_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.cached_bytes -= size;
  } else {
    try {
      p = malloc_(size);
    } catch (const Error&) {
      if (stats_.cached_bytes == 0) throw;
      for (auto& [s, blocks] : cached_)  // out of memory: give the cache back and try once more
        for (void* b : blocks) free_(b);
      cached_.clear();
      stats_.cached_bytes = 0;
      p = malloc_(size);
    }
    ++stats_.device_allocations;
  }
  in_use_[p] = size;
  stats_.in_use_bytes += size;
  return p;
}

void CachingAllocator::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_use_.find(p);
  IL_CHECK(it != in_use_.end(), "device memory: freeing a block this allocator did not hand out");
  cached_[it->second].push_back(p);
  stats_.in_use_bytes -= it->second;
  stats_.cached_bytes += it->second;
  in_use_.erase(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, blocks] : cached_)
    for (void* b : blocks) free_(b);
  cached_.clear();
  stats_.cached_bytes = 0;
}

CachingAllocator::Stats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace inferlab
