// The device allocator's cache, tested over host memory: a decode loop's repeated allocations
// reach the device allocator only on the first step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>

#include "common/caching_allocator.h"
#include "common/error.h"
#include "test_util.h"

namespace inferlab {
namespace {

struct CountingDevice {
  std::size_t limit = std::size_t(1) << 30, used = 0;
  std::set<void*> live;
  std::map<void*, std::size_t> sizes;
  CachingAllocator allocator{[this](std::size_t n) -> void* {
                               if (used + n > limit) fail("out of memory: ", n, " bytes");
                               void* p = std::malloc(n);
                               live.insert(p), sizes[p] = n, used += n;
                               return p;
                             },
                             [this](void* p) {
    live.erase(p), used -= sizes[p], sizes.erase(p);
    std::free(p);
                             }};
  ~CountingDevice() { allocator.empty_cache(); }
};

TEST(CachingAllocator, ADecodeLoopAllocatesFromTheDeviceOnlyOnItsFirstStep) {
  CountingDevice dev;
  const std::vector<std::size_t> step = {4096, 4096, 64, 3 << 20, 100, 4096};  // one step's tensors
  for (int s = 0; s < 50; ++s) {
    std::vector<void*> blocks;
    for (std::size_t n : step) blocks.push_back(dev.allocator.allocate(n));
    EXPECT_EQ(std::set<void*>(blocks.begin(), blocks.end()).size(), blocks.size()) << "a block handed out twice";
    for (void* p : blocks) dev.allocator.release(p);
  }
  EXPECT_EQ(dev.allocator.stats().device_allocations, step.size());
  EXPECT_EQ(dev.allocator.stats().in_use_bytes, 0u);
  EXPECT_EQ(dev.allocator.stats().cached_bytes, dev.used);
  dev.allocator.empty_cache();
  EXPECT_TRUE(dev.live.empty());
  dev.allocator.release(nullptr);  // fine, like free(nullptr)
}

TEST(CachingAllocator, SizesRoundUpAndOutOfMemoryGivesTheCacheBackFirst) {
  EXPECT_EQ(CachingAllocator::rounded(1), 512u);
  EXPECT_EQ(CachingAllocator::rounded(512), 512u);
  EXPECT_EQ(CachingAllocator::rounded(513), 1024u);
  EXPECT_EQ(CachingAllocator::rounded((1 << 20) + 1), std::size_t(2) << 20);
  CountingDevice dev;
  dev.limit = 8 << 20;
  void* a = dev.allocator.allocate(6 << 20);
  dev.allocator.release(a);                   // cached: 6 MiB held, 2 MiB left on the "device"
  void* b = dev.allocator.allocate(4 << 20);  // does not fit beside the cache: the cache goes back
  EXPECT_EQ(dev.allocator.stats().cached_bytes, 0u);
  EXPECT_EQ(dev.used, std::size_t(4) << 20);
  test::expect_error([&] { dev.allocator.allocate(6 << 20); }, {"out of memory"});  // nothing cached to give back
  dev.allocator.release(b);
  int x = 0;
  test::expect_error([&] { dev.allocator.release(&x); }, {"did not hand out"});
}

}  // namespace
}  // namespace inferlab
