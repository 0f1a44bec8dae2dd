// A llama2.c checkpoint (.bin): the header and the weights it promises.
#include "common/llama2c.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace inferlab;
  const std::string path = fuzz::write_input(data, size, "model.bin");
  fuzz::expect_clean([&] {
    const Llama2cCheckpoint ck = load_llama2c(path);
    for (const auto& [name, t] : ck.tensors)
      if (t.numel() > 0 && t.numel() < (1 << 16)) t.to_double_vector();
  });
  return 0;
}
